"""A small, offline stand-in for ``kustomize build``: enough to render deploy/k8s/.

Neither ``kustomize`` nor ``kubectl`` is installed here, so the manifest tests render the
overlays with this. It implements only the kustomization fields deploy/k8s uses, and
raises on any other, so a manifest cannot silently depend on something it skips:

- ``resources``: YAML files (multi-document) and directories holding a kustomization;
- ``namespace``: set on every resource except Namespaces;
- ``labels`` (``pairs``, ``includeTemplates``): added to metadata (and pod templates);
- ``images`` (``name``, ``newName``, ``newTag``): rewrite container images;
- ``replicas`` (``name``, ``count``);
- ``patches`` with ``path`` only: strategic merge patches whose target is the resource of
  the same kind and name. Maps merge key by key; lists of maps merge by the Kubernetes
  merge key of the list (``name``; ``mountPath`` for volumeMounts, ``containerPort`` for
  container ports, ``port`` for Service ports); other lists are replaced. No ``$patch``
  directives, no JSON 6902 patches.

Where kustomize exists, ``kustomize build deploy/k8s/overlays/<name>`` is the final word;
the two should agree on these files.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "replicas",
             "patches"}
# The merge key of a list, by the list's field name (Kubernetes strategic merge patch).
MERGE_KEYS = {"volumeMounts": "mountPath", "ports": "containerPort"}
SERVICE_PORT_KEY = "port"


def render(directory: Path) -> list[dict[str, Any]]:
    """The resources ``kustomize build directory`` would print, in resource order."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise ValueError(f"{directory}: kustomization fields {sorted(unknown)} not supported")
    docs: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise ValueError(f"{directory}: only patches with a path are supported: {patch}")
        _apply_patch(docs, yaml.safe_load((directory / patch["path"]).read_text()), directory)
    for doc in docs:
        _apply_fields(doc, kustomization)
    return docs


def _apply_fields(doc: dict[str, Any], kustomization: dict[str, Any]) -> None:
    meta = doc.setdefault("metadata", {})
    if "namespace" in kustomization and doc["kind"] != "Namespace":
        meta["namespace"] = kustomization["namespace"]
    for label in kustomization.get("labels", []):
        meta.setdefault("labels", {}).update(label["pairs"])
        template = doc.get("spec", {}).get("template")
        if label.get("includeTemplates") and template is not None:
            template.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    for replicas in kustomization.get("replicas", []):
        if meta.get("name") == replicas["name"]:
            doc["spec"]["replicas"] = replicas["count"]
    for image in kustomization.get("images", []):
        for container in _containers(doc):
            name, _, tag = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = (f"{image.get('newName', name)}:"
                                      f"{image.get('newTag', tag)}")


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def _apply_patch(docs: list[dict[str, Any]], patch: dict[str, Any], where: Path) -> None:
    targets = [d for d in docs if d["kind"] == patch["kind"]
               and d["metadata"]["name"] == patch["metadata"]["name"]]
    if len(targets) != 1:
        raise ValueError(f"{where}: patch {patch['kind']}/{patch['metadata']['name']} matches "
                         f"{len(targets)} resources")
    merged = _merge(targets[0], patch, "")
    targets[0].clear()
    targets[0].update(merged)


def _merge(base: Any, patch: Any, field: str) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value, key) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and _all_maps(base + patch):
        key = _merge_key(field, base + patch)
        if key is not None:
            out = copy.deepcopy(base)
            for item in patch:
                match = next((i for i, b in enumerate(out) if b.get(key) == item.get(key)), None)
                if match is None:
                    out.append(copy.deepcopy(item))
                else:
                    out[match] = _merge(out[match], item, "")
            return out
    return copy.deepcopy(patch)


def _all_maps(items: list[Any]) -> bool:
    return all(isinstance(item, dict) for item in items)


def _merge_key(field: str, items: list[dict[str, Any]]) -> str | None:
    key = MERGE_KEYS.get(field, "name")
    if field == "ports" and not all(key in item for item in items):
        key = SERVICE_PORT_KEY
    return key if all(key in item for item in items) else None
