"""A job trained entirely from agent episodes, through the whole stack: `libra up`, the
agent-calc example spec (task.agent = "external") on a tiny random Qwen2 model,
`libra agent run` launching the example agent (examples/agents/calc_agent.py, the
official `openai` client) once per admitted episode; two RL steps train on what the
program's calls produced."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis as redis_sync
from transformers import AutoTokenizer

from libra import redis_keys as keys
from libra import types as t
from libra.wire.common import decode_trajectory
from libra_cli import stack
from libra_cli.main import load_spec
from tests.fixtures.hf_models import make_model_dir
from tests.integration.stack_helpers import ROOT, wait_for_job

pytestmark = pytest.mark.integration

CONTEXT_TOKENS = 2048
BRIEF = ["algorithm.num_steps=2", "algorithm.sft_steps=1", "algorithm.sft_batch_size=2",
         "algorithm.prompts_per_step=2", "algorithm.samples_per_prompt=2",
         "algorithm.checkpoint_interval=0", "task.max_new_tokens_per_turn=16",
         "task.episode_idle_timeout_s=60.0", f"model.max_context_tokens={CONTEXT_TOKENS}",
         "layout.policy=\"least_loaded\"",
         f"layout.buckets=[{{name = \"short\", max_tokens = {CONTEXT_TOKENS // 2}}}, "
         f"{{name = \"long\", max_tokens = {CONTEXT_TOKENS}}}]"]


@pytest.fixture
def running_stack(shared_stack: dict) -> dict:
    """The package's shared stack (conftest.py): this module's job only submits and reads."""
    return shared_stack


async def test_a_job_trains_on_episodes_of_an_openai_agent_program(
        running_stack: dict, tmp_path_factory: pytest.TempPathFactory) -> None:
    model = make_model_dir("qwen2", tmp_path_factory.mktemp("tiny-qwen2"),
                           max_position_embeddings=CONTEXT_TOKENS)
    data, _ = load_spec(ROOT / "deploy" / "configs" / "agent-calc.toml",
                        [*BRIEF, f"model.path={json.dumps(str(model))}"])
    client = stack.coordinator_client(running_stack)
    job = await client.create_job(json.dumps(data), "json")
    driver = subprocess.Popen(
        [sys.executable, "-m", "libra_cli.main", "--run-root", running_stack["run_root"],
         "agent", "run", "--job", job.job_id, "--command",
         f"{sys.executable} examples/agents/calc_agent.py", "-n", "4", "--timeout-s", "120",
         "--json"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job, steps, counters = await wait_for_job(client, job.job_id, timeout_s=600)
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()  # the driver's own pid
        await client.close()
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert [s["step"] for s in steps] == [1, 2]
    assert counters["trained"] == 2 * 2 * 2
    summary = json.loads(out)
    assert driver.returncode == 0, err
    # Copies still waiting when the job ended (the staleness budget admits ahead) are
    # stopped; every other one exited 0.
    assert summary["episodes"] >= 8 and summary["timed_out"] == 0, summary
    assert set(summary["exit_codes"]) <= {"0"}, summary
    assert summary["exit_codes"].get("0", 0) + summary["stopped_at_job_end"] >= 8, summary
    r = redis_sync.from_url(running_stack["redis_url"])
    trajs = [decode_trajectory(f[b"data"]) for _, f in r.xrange(keys.trajectories(job.job_id))]
    finished = [tr for tr in trajs if tr.status is t.TrajectoryStatus.FINISHED]
    assert len(finished) >= 8
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    for traj in finished:
        assert traj.check_aligned() is None
        assert sum(traj.loss_mask) > 0  # the program's turns were sampled by the policy
        # The prompt is the program's own conversation: its system message, its tools
        # and the dataset problem it was given.
        prompt = tokenizer.decode(traj.token_ids[:traj.num_prompt_tokens])
        assert "You solve math word problems." in prompt and '"calculator"' in prompt
        assert traj.prompt_text in prompt
