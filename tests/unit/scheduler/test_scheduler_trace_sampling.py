"""Admission gives every trajectory its trace context, sampled as the job's
``[observability] trace_sample_ratio`` says (libra/tracing.py): the decision is made
once, here, and travels in the traceparent's flag. Real: SchedulerCore over the
in-memory store, the built-in arith dataset."""

from __future__ import annotations

from libra.clock import FakeClock
from libra.jobspec import parse_job_spec
from libra.tracing import TraceParent
from services.scheduler.core import SchedulerCore
from services.scheduler.memory_store import MemorySchedulerStore

JOB = "job-1"


async def admitted(spec_text: str, num_groups: int) -> list[TraceParent | None]:
    spec = parse_job_spec(spec_text)
    store = MemorySchedulerStore()
    store.put_job(JOB, spec.to_json(), published=False)
    core = SchedulerCore(store, FakeClock())
    await core.start_job(JOB)
    run = core._jobs[JOB]
    return [TraceParent.parse(tr.traceparent)
            for index in range(num_groups) for tr in core._make_group(run, index)]


async def test_a_small_job_traces_every_trajectory_each_in_its_own_trace() -> None:
    parents = await admitted("[algorithm]\nprompts_per_step = 2\nsamples_per_prompt = 4\n", 8)
    assert all(p is not None and p.sampled for p in parents)
    assert len({p.trace_id for p in parents if p}) == len(parents) == 32


async def test_a_large_job_traces_about_64_trajectories_per_step() -> None:
    # 64 prompts x 8 samples = 512 a step: the automatic ratio is 64 / 512.
    parents = await admitted("[algorithm]\nprompts_per_step = 64\nsamples_per_prompt = 8\n",
                             64)
    sampled = sum(1 for p in parents if p is not None and p.sampled)
    assert all(p is not None for p in parents)
    assert 0.08 * len(parents) < sampled < 0.17 * len(parents)


async def test_ratio_zero_carries_unsampled_contexts() -> None:
    parents = await admitted("[algorithm]\nprompts_per_step = 2\nsamples_per_prompt = 2\n"
                             "[observability]\ntrace_sample_ratio = 0.0\n", 4)
    assert parents and all(p is not None and not p.sampled for p in parents)
