"""SchedulerCore's prompts come from the job's dataset (libra/data): the built-in tasks in
their legacy order, file rows with their messages, and rows that cannot be rendered
skipped and counted. Real: the ``datasets`` library on files in tmp (the in-memory store)."""

from __future__ import annotations

import random

from libra.clock import FakeClock
from libra.jobspec import JobSpec, parse_job_spec
from libra.tasks import load_problems
from services.scheduler.core import SchedulerCore
from services.scheduler.memory_store import MemorySchedulerStore
from tests.fixtures.data_files import chat_rows, word_rows, write_jsonl

JOB = "job-1"


async def started(spec: JobSpec) -> SchedulerCore:
    store = MemorySchedulerStore()
    store.put_job(JOB, spec.to_json(), published=False)
    core = SchedulerCore(store, FakeClock())
    await core.start_job(JOB)
    return core


async def test_builtin_groups_keep_the_legacy_prompts_and_order() -> None:
    spec = parse_job_spec("[task]\nseed = 2\nnum_prompts = 8\n[algorithm]\n"
                          "prompts_per_step = 2\nsamples_per_prompt = 2\n")
    core = await started(spec)
    run = core._jobs[JOB]
    groups = [core._make_group(run, index) for index in range(24)]
    problems = load_problems("arith", 2, 8)
    order = [i for epoch in range(3) for i in random.Random(2 * 1000 + epoch).sample(range(8), 8)]
    assert [g[0].prompt_id for g in groups] == [problems[i].prompt_id for i in order]
    assert [(g[1].prompt_text, g[1].reference) for g in groups] == [
        (problems[i].prompt, str(problems[i].answer)) for i in order]
    assert all(tr.prompt_messages_json == "" for g in groups for tr in g)


async def test_messages_rows_reach_the_trajectories(tmp_path,
                                                    datasets_cache) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", chat_rows(4))
    spec = parse_job_spec(
        f'[model]\nkind = "hf"\npath = "m"\n[task]\nkind = "jsonl"\npath = "{path}"\n'
        'messages_field = "messages"\nreference_field = "answer"\ntool_call_format = "hermes"\n'
        "[algorithm]\nsft_steps = 0\nprompts_per_step = 2\nsamples_per_prompt = 2\n")
    core = await started(spec)
    group = core._make_group(core._jobs[JOB], 0)
    index = int(group[0].prompt_id.removeprefix("row-"))
    row = chat_rows(4)[index]
    assert [tr.prompt_id for tr in group] == [f"row-{index}"] * 2
    assert group[0].reference == row["answer"]
    assert group[0].prompt_text == "Be brief.\n" + row["messages"][1]["content"]
    assert '"role": "system"' in group[1].prompt_messages_json


async def test_a_row_that_cannot_be_rendered_is_skipped_and_counted(
        tmp_path, datasets_cache) -> None:
    rows = word_rows(4)
    rows[1]["question"] = "   "  # blank: the submit check would refuse it; here it is served
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    spec = parse_job_spec(
        f'[task]\nkind = "jsonl"\npath = "{path}"\nprompt_field = "question"\n'
        'reference_field = "answer"\n[algorithm]\nsft_steps = 0\nprompts_per_step = 2\n')
    core = await started(spec)
    run = core._jobs[JOB]
    ids = [core._make_group(run, index)[0].prompt_id for index in range(3)]
    assert sorted(ids) == ["row-0", "row-2", "row-3"]
    assert (await core.stats(JOB))["skipped_rows"] == 1
