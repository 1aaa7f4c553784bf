"""A service's start-up imports leave out torch and transformers (seconds of CPU per
process start: 4-7 s measured, most of a stack's start on two cores). The coordinator,
scheduler and tool gateway never need them; the trainer service loads them at its first
job (services/trainer/lazy_backend.py), a trainer rank process once it has joined one
(services/trainer/distributed.py), the rollout service when its first job's engine is built
or it is lent to a trainer (services/rollout/backend.py, hybrid_backend.py). A rollout that
registers before the coordinator listens waits for it (peers.startup_wait_s): its faster
start once raced the coordinator's under `libra up`.

Each entry point is imported in a fresh interpreter (this one has torch loaded), which
reports the heavy modules it then holds and, for the first one, the chain of imports that
reached it, so a failure names the line to make lazy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from libra.jobspec import JobSpec, ModelSpec
from services.rollout.backend import TorchEngineLoader
from services.trainer.lazy_backend import LazyBackendFactory

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers")

PROBE = """
import importlib, json, sys, traceback
HEAVY = sys.argv[2:]
chains = {}
class Probe:
    def find_spec(self, name, path=None, target=None):
        if name in HEAVY and name not in chains:
            chains[name] = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()
                            if "importlib" not in f.filename and "<" not in f.filename]
        return None
sys.meta_path.insert(0, Probe())
importlib.import_module(sys.argv[1])
print(json.dumps({name: chains.get(name, []) for name in HEAVY if name in sys.modules}))
"""


def _heavy_after_import(module: str) -> dict[str, list[str]]:
    """The heavy modules loaded by importing ``module``, each with its import chain."""
    out = subprocess.run([sys.executable, "-c", PROBE, module, *HEAVY], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("entry_point", [
    "services.coordinator.__main__", "services.scheduler.__main__",
    "services.toolgateway.__main__", "services.trainer.__main__", "services.rollout.__main__",
])
def test_a_service_starts_without_torch_or_transformers(entry_point: str) -> None:
    heavy = _heavy_after_import(entry_point)
    assert heavy == {}, "\n".join(f"{name} <- " + " <- ".join(reversed(chain))
                                  for name, chain in heavy.items())


def test_a_trainer_rank_waits_for_a_job_without_transformers() -> None:
    # The rank's process (and the child it spawns for each attempt to join, which imports
    # the same module) needs torch.distributed to dial rank 0; the model comes after.
    heavy = _heavy_after_import("services.trainer.rank")
    assert set(heavy) == {"torch"}, heavy


def test_the_probe_sees_an_eager_import() -> None:
    # This module imports torch at its top (and is cheap to import): the checks above can
    # fail, and would name the line.
    heavy = _heavy_after_import("libra.training.tensors")
    assert set(heavy) == {"torch"}
    assert any("libra/training/tensors.py" in frame for frame in heavy["torch"])


def test_the_lazy_factory_builds_the_backend_at_the_first_job(tmp_path: Path) -> None:
    from libra.training.backend import JobBackend, TorchBackendFactory

    factory = LazyBackendFactory(num_threads=1, num_ranks=1)
    assert factory._factory is None  # nothing built (or imported for it) before a job
    spec = JobSpec(model=ModelSpec(hidden_size=32, num_layers=1, num_heads=2,
                                   intermediate_size=64))
    first = factory.create(spec, str(tmp_path / "a"))
    inner = factory._factory
    assert isinstance(inner, TorchBackendFactory) and isinstance(first, JobBackend)
    second = factory.create(spec, str(tmp_path / "b"))
    assert factory._factory is inner and second is not first  # one factory, a backend a job


def test_the_rollout_loader_resolves_its_device_and_builds_the_engine_at_the_first_load(
        hf_model_dir) -> None:
    from libra.models.hf import default_device
    from services.rollout.torch_engine import TorchEngine

    loader = TorchEngineLoader(num_threads=1)
    assert loader._device == ""  # not resolved (torch not asked) before a job
    engine, tokenizer = loader.load(str(hf_model_dir("llama")), None, 1, ModelSpec(kind="hf"))
    assert loader._device == default_device() and isinstance(engine, TorchEngine)
    assert tokenizer.decode(tokenizer.encode("2+2=4")) == "2+2=4"
    assert loader.context_limit_tokens == tokenizer.max_context_tokens > 0
