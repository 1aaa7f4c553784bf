"""What a job spec must pass before the coordinator stores it, in one place.

The schema (``libra.jobspec``), the agent name, then the injected checks: the tools' data
files (:class:`CorpusCheck`), the model (:class:`ModelCheck`), the dataset
(:class:`DatasetCheck`), ``algorithm.init_from`` (:class:`InitFromCheck`), and finally
the tool gateway's registries (:class:`ToolCatalog`), whose schemas are frozen into the
spec. Each failure is InvalidArgument naming the field. The blocking checks run off the
event loop. Pure: the checks that read files or call the gateway are injected.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from libra.agents import check_agent_name
from libra.errors import InvalidArgument, LibraError, Unavailable
from libra.jobspec import JobSpec, ToolSchema, parse_job_spec


class ModelCheck(Protocol):
    """Checks a parsed spec's model before the job is stored (blocking: it reads files).

    Raises InvalidArgument naming the field (``model.path``, ``model.dtype``, ...) when
    the model cannot be loaded or trained here. The service wires
    ``services/coordinator/model_check.py`` (torch, transformers stay out of the core).
    """

    def __call__(self, spec: JobSpec) -> None: ...


class DatasetCheck(Protocol):
    """Checks a parsed spec's dataset before the job is stored (blocking: it reads the
    file). Raises InvalidArgument naming the field and row (``task.prompt_field: row 3
    has no field 'question'``); the service wires ``services/coordinator/dataset_check.py``.
    """

    def __call__(self, spec: JobSpec) -> None: ...


class CorpusCheck(Protocol):
    """Checks the files a job's tools will read (``tools.search_corpus``) lie inside the
    tool data roots (blocking: it resolves symlinks). Raises InvalidArgument naming
    ``tools.search_corpus[i]``; the service wires ``libra.data_roots``."""

    def __call__(self, spec: JobSpec) -> None: ...


class InitFromCheck(Protocol):
    """Checks ``algorithm.init_from`` before the job is stored (blocking: it hashes the
    checkpoint's files): it names a checkpoint under ``run_root`` (or a directory) that
    verifies and fits ``[model]``; else InvalidArgument("algorithm.init_from", ...).
    The service wires ``services/coordinator/init_from_check.py``."""

    def __call__(self, spec: JobSpec, run_root: Path) -> None: ...


class ToolCatalog(Protocol):
    """The tool gateway's ListTools (``[{"name", "description", "args_schema", ...}]``) and
    ListRewards (``[{"name", "description"}]``): its registries, the only lists of names."""

    async def list_tools(self) -> list[dict[str, Any]]: ...

    async def list_rewards(self) -> list[dict[str, Any]]: ...


def _check_rewards(spec: JobSpec, known: list[str]) -> None:
    """Every reward the job calls (a composite's parts too) is registered on the gateway."""
    fields = ["reward.name"] + [f"reward.components[{i}].name"
                                for i in range(len(spec.reward.components))]
    for path, name in zip(fields, spec.reward.names(), strict=True):
        if name not in known:
            raise InvalidArgument(path, f"the tool gateway has no reward {name!r} (it has: "
                                        f"{', '.join(known)})")


@dataclass(frozen=True, slots=True)
class SpecChecks:
    """The injected checks; None skips one (unit tests of the lifecycle; ``__main__``
    wires them all)."""

    run_root: Path
    model_check: ModelCheck | None = None
    dataset_check: DatasetCheck | None = None
    init_from_check: InitFromCheck | None = None
    corpus_check: CorpusCheck | None = None
    tool_catalog: ToolCatalog | None = None

    async def checked_spec(self, spec_text: str, spec_format: str) -> JobSpec:
        """The parsed spec once every check passed, with the tools' schemas frozen in."""
        spec = parse_job_spec(spec_text, spec_format)
        check_agent_name(spec.task.agent)  # built-ins + libra.agents entry points
        if self.corpus_check is not None and spec.tools.search_corpus:
            await asyncio.to_thread(self.corpus_check, spec)
        if self.model_check is not None:
            # Off the event loop: it reads config/tokenizer files (about a second), and
            # leases must keep renewing meanwhile.
            await asyncio.to_thread(self.model_check, spec)
        if self.dataset_check is not None:
            await asyncio.to_thread(self.dataset_check, spec)  # a 1M-row file: seconds
        if self.init_from_check is not None and spec.algorithm.init_from:
            await asyncio.to_thread(self.init_from_check, spec, self.run_root)
        return await self._resolve_tools(spec)

    async def _resolve_tools(self, spec: JobSpec) -> JobSpec:
        """Check the enabled tools against the gateway and freeze their schemas into the
        spec, so the trainer's warm start and every rollout render the same prompt."""
        if self.tool_catalog is None:
            return spec
        try:
            catalog = {tool["name"]: tool for tool in await self.tool_catalog.list_tools()}
            rewards = sorted(r["name"] for r in await self.tool_catalog.list_rewards())
        except LibraError as exc:
            if spec.task.tool_call_format == "arith":
                return spec  # the tag protocol renders no schemas: the gateway may come later
            raise Unavailable(f"tool gateway unreachable ({exc}); a {spec.task.tool_call_format}"
                              " job needs its tools' schemas at submit: start the gateway "
                              "and submit again") from exc
        for index, name in enumerate(spec.tools.enabled):
            if name not in catalog:
                raise InvalidArgument(f"tools.enabled[{index}]", f"the tool gateway has no tool "
                                      f"{name!r} (it has: {', '.join(sorted(catalog))})")
        _check_rewards(spec, rewards)
        schemas = [ToolSchema(name=name, description=catalog[name].get("description", ""),
                              parameters_json=json.dumps(catalog[name].get("args_schema", {}),
                                                         sort_keys=True))
                   for name in spec.tools.enabled]
        return dataclasses.replace(spec, tools=dataclasses.replace(spec.tools, schemas=schemas))
