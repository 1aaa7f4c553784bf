"""Built-in rewards (the judge against a local HTTP server) and the search tool."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from libra.errors import Unavailable
from services.toolgateway.core import ScoreRequest, ToolCall, ToolGatewayCore, ToolGatewayLimits
from services.toolgateway.rewards import LlmJudgeConfig, LlmJudgeReward, RewardRegistry
from services.toolgateway.rewards.llm_judge import parse_score
from services.toolgateway.tools import SearchConfig, ToolRegistry, builtin_tools
from services.toolgateway.tools.search import SAMPLE_CORPUS
from tests.fixtures.judge_server import serve_judge


def req(reward, text, reference="", **extra):
    return ScoreRequest("t", reward, text, reference, extra)


@pytest.mark.parametrize("text, ref, want", [
    ("Paris.", "paris", 1.0), ("  PARIS  ", "Paris", 1.0), ("Lyon", "Paris", 0.0)])
async def test_exact_match(core, text, ref, want):
    assert (await core.score(req("exact_match", text, ref))).reward == want


@pytest.mark.parametrize("text, ref, want", [
    ("The answer is 42.", "42", 1.0), ("0.75", "3/4", 1.0), ("3/4", "0.75", 1.0),
    ("$1,000", "1000", 1.0), ("41.9999999999", "42", 1.0), ("43", "42", 0.0),
    ("no number", "1", 0.0), ("1e3", "1000", 1.0)])
async def test_numeric(core, text, ref, want):
    assert (await core.score(req("numeric", text, ref))).reward == want


async def test_code_tests_fraction(core):
    code = "```python\ndef add(a, b):\n    return a + b if a else 0\n```"
    tests = "assert add(1, 2) == 3\nassert add(0, 5) == 5"
    result = await core.score(req("code_tests", code, tests))
    assert result.reward == 0.5 and result.details["passed"] == 1


async def test_code_tests_crash_scores_zero(core):
    result = await core.score(req("code_tests", "import os\nos._exit(0)", "assert True"))
    assert result.reward == 0.0


@pytest.fixture
def judge_reply() -> Iterator[list[str]]:
    """The judge's answer (replace ``[0]`` to change it) and its server, for one test."""
    reply = ["Score: 0.8"]
    with serve_judge(lambda _path, _body: reply[0]) as server:
        reply.append(server.url)
        yield reply


async def test_llm_judge_parses_score(judge_reply):
    judge = LlmJudgeReward(LlmJudgeConfig(base_url=judge_reply[1], model="judge",
                                          requests_per_s=100))
    try:
        assert (await judge.score(req("llm_judge", "a", "b"))).reward == 0.8
        judge_reply[0] = "I cannot grade this"
        with pytest.raises(Unavailable, match="no score"):
            await judge.score(req("llm_judge", "a", "b"))
    finally:
        await judge.aclose()


async def test_llm_judge_unreachable_is_unavailable():
    judge = LlmJudgeReward(LlmJudgeConfig(base_url="http://127.0.0.1:9", model="judge",
                                          timeout_s=1.0))
    with pytest.raises(Unavailable):
        await judge.score(req("llm_judge", "a", "b"))
    await judge.aclose()


@pytest.mark.parametrize("text, want", [("0.5", 0.5), ("score=1", 1.0), ("10 then 0", 0.0),
                                        ("7", None)])
def test_parse_score(text, want):
    assert parse_score(text) == want


async def test_token_bucket_spaces_requests():
    import time

    from services.toolgateway.rewards.llm_judge import TokenBucket
    bucket = TokenBucket(rate_per_s=20, capacity=1)
    start = time.monotonic()
    for _ in range(3):
        await bucket.acquire()
    assert time.monotonic() - start >= 0.09


async def test_search_returns_relevant_snippet(core):
    result = await core.execute(ToolCall("t", "s", "search", {"query": "capital of France"}))
    assert result.output.startswith("[1] Paris")
    empty = await core.execute(ToolCall("t", "s2", "search", {"query": "zzzz"}))
    assert empty.output == "no results"


async def test_search_uses_the_corpus_the_job_names(sandbox, readable_tmp):
    # readable_tmp is the data root here (test_search_data_roots.py covers the refusals).
    core = ToolGatewayCore(ToolRegistry(builtin_tools(sandbox, search=SearchConfig(
        data_roots=(str(readable_tmp),)))), RewardRegistry([]), ToolGatewayLimits())
    kb = readable_tmp / "kb.txt"
    kb.write_text("Zanzibar lies off the coast of Tanzania.\n\nOther text about boats.\n")
    result = await core.execute(ToolCall("t", "s3", "search", {"query": "Zanzibar coast"},
                                         options={"corpus_paths": [str(kb)]}))
    assert result.output.startswith("[1] Zanzibar")
    default = await core.execute(ToolCall("t", "s4", "search", {"query": "Zanzibar coast"}))
    assert default.output == "no results"  # the gateway's own corpus knows nothing of it


async def test_search_with_an_unreadable_job_corpus_fails_clearly(core):
    missing = str(SAMPLE_CORPUS.parent / "missing.txt")  # inside the default roots
    result = await core.execute(ToolCall("t", "s5", "search", {"query": "x"},
                                         options={"corpus_paths": [missing]}))
    assert result.status.value == "failure"
    assert "corpus unreadable" in result.error
