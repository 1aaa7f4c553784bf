"""The example jobs beside the demo run through the whole stack with a tiny random
Hugging Face model (their SmolLM2 runs are measured in the closing notes, not here):
their datasets load, their tools answer, their rewards score, two RL steps train.

- deploy/configs/almanac-tools.toml: search (BM25 over the shipped corpus) + python.
- deploy/configs/receipts-composite.toml: chat-message prompts, python, a composite reward
  (numeric + format) recorded per component, held-out eval rounds in the report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra import types as t
from libra.jobspec import job_spec_from_json
from libra_cli import stack
from libra_cli.main import load_spec
from libra_cli.report import build_report
from tests.fixtures.hf_models import make_model_dir
from tests.integration.stack_helpers import ROOT, wait_for_job

pytestmark = pytest.mark.integration

CONTEXT_TOKENS = 4096
BRIEF = ["algorithm.num_steps=2", "algorithm.sft_steps=1", "algorithm.sft_batch_size=2",
         "algorithm.prompts_per_step=2", "algorithm.samples_per_prompt=2",
         "algorithm.checkpoint_interval=0", "task.max_turns=2",
         "task.max_new_tokens_per_turn=16", f"model.max_context_tokens={CONTEXT_TOKENS}",
         f"layout.buckets=[{{name = \"short\", max_tokens = {CONTEXT_TOKENS // 2}}}, "
         f"{{name = \"long\", max_tokens = {CONTEXT_TOKENS}}}]"]


@pytest.fixture
def running_stack(shared_stack: dict) -> dict:
    """The package's shared stack (conftest.py): this module's jobs only submit and read."""
    return shared_stack


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir("qwen2", tmp_path_factory.mktemp("tiny-qwen2"),
                          max_position_embeddings=CONTEXT_TOKENS)


async def _run(stack_state: dict, config: str, model: Path, monkeypatch,
               extra: tuple[str, ...] | list[str] = ()) -> t.Job:
    monkeypatch.chdir(ROOT)  # the configs' relative paths resolve against the repo root
    data, _ = load_spec(ROOT / "deploy" / "configs" / config,
                        [*BRIEF, f"model.path={json.dumps(str(model))}", *extra])
    client = stack.coordinator_client(stack_state)
    try:
        job = await client.create_job(json.dumps(data), "json")
        job, steps, counters = await wait_for_job(client, job.job_id, timeout_s=600)
    finally:
        await client.close()
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert [s["step"] for s in steps] == [1, 2]
    assert counters["trained"] == 2 * 2 * 2
    return job


async def test_almanac_tools_runs_with_search_and_python(running_stack: dict, tiny_model: Path,
                                                         monkeypatch) -> None:
    job = await _run(running_stack, "almanac-tools.toml", tiny_model, monkeypatch)
    spec = job_spec_from_json(job.spec_json)
    assert [s.name for s in spec.tools.schemas] == ["search", "python"]
    assert spec.tools.search_corpus == [str(ROOT / "deploy" / "data" / "almanac-corpus.txt")]


async def test_receipts_composite_records_components_and_eval_rounds(
        running_stack: dict, tiny_model: Path, monkeypatch, tmp_path: Path) -> None:
    job = await _run(running_stack, "receipts-composite.toml", tiny_model, monkeypatch,
                     ["task.eval_interval=1", "task.eval_max_prompts=2",
                      "task.eval_samples_per_prompt=2"])
    client = stack.coordinator_client(running_stack)
    try:
        job, steps, counters = await client.get_job(job.job_id)
        events = await client.get_job_events(job.job_id)
    finally:
        await client.close()
    for step in steps:  # each part of the composite, averaged over the step's batch
        assert set(step["reward_components"]) == {"numeric", "format"}
        assert all(0.0 <= v <= 1.0 for v in step["reward_components"].values())
    report = build_report(job, steps, counters, 1.0, events, storage={})
    # Before training and after the last step always; after step 1 unless training had
    # already passed it when the scheduler looked (overtaken rounds are skipped).
    assert [e["step"] for e in report["eval"]] in ([0, 1, 2], [0, 2])
    assert all(e["num_samples"] == 4 and "2" in e["pass_at_k"] for e in report["eval"])
    assert report["trajectories"]["unaccounted"] == 0
