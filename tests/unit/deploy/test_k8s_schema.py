"""deploy/k8s/: every rendered object is valid Kubernetes.

The overlays are rendered offline (``kustomize_lite`` through k8s_checks.py: no kustomize
or kubectl here) and every object is validated with ``kubernetes_validate`` (the official
OpenAPI schemas, strict: unknown fields are errors) against a fixed Kubernetes version.
Broken copies must fail, so the validation is known to bite. What a schema cannot check
is in test_k8s_manifests.py.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from tests.unit.deploy.k8s_checks import OVERLAYS, render_overlay

# Oldest release the manifests target: native gRPC probes (1.27) and the StatefulSet
# pod-index label the trainer ranks read their rank from (1.28, on by default).
K8S_VERSION = "1.30.0"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_is_valid_kubernetes(overlay: str) -> None:
    docs = render_overlay(overlay)
    assert {d["kind"] for d in docs} >= {"Deployment", "StatefulSet", "Service",
                                         "PersistentVolumeClaim", "NetworkPolicy"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(port=50051),
     "Additional properties"),
    (lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(
        containerPort="grpc"), "is not of type"),
    (lambda d: d["spec"].pop("selector"), "'selector' is a required property"),
])
def test_schema_validation_rejects_broken_objects(mutate: Any, message: str) -> None:
    """The schemas really are enforced (guards against a vacuous validation)."""
    doc = copy.deepcopy(next(d for d in render_overlay("cpu-demo")
                             if d["metadata"]["name"] == "coordinator"
                             and d["kind"] == "Deployment"))
    mutate(doc)
    with pytest.raises(kubernetes_validate.ValidationError, match=message):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
