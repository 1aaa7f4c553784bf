"""``llm_judge`` configured per job (``[reward.llm_judge]``), through the real gateway
over gRPC, against a real local OpenAI-compatible HTTP server started here (http.server
on a free port answering ``/v1/chat/completions`` deterministically).

The spec's section travels as the Score request's options, exactly as the rollout sends
it (``RewardSpec.options_json``); the API key comes from the environment variable the
spec names, read on the gateway."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from libra import types as t
from libra.errors import Internal
from libra.rewardspec import LlmJudgeSpec, RewardComponent, RewardSpec
from tests.fixtures.judge_server import JudgeServer, serve_judge


def _grade(path: str, body: dict) -> str:
    # Deterministic: full marks when the graded answer is the reference.
    return "Score: 1" if "answer=4 reference=4" in body["messages"][0]["content"] else "Score: 0.25"


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with serve_judge(_grade) as server:
        yield server


def score_input(reward: RewardSpec, answer: str) -> t.ScoreInput:
    messages = (t.TranscriptMessage("user", "What is 2+2?"),
                t.TranscriptMessage("assistant", f"<ans>{answer}</ans>"))
    return t.ScoreInput("traj", reward.name, answer, "4", messages, "", 1,
                        reward.options_json())


def judge_spec(url: str, **kw) -> LlmJudgeSpec:
    return LlmJudgeSpec(base_url=url, model="grader-1", requests_per_s=1000.0,
                        prompt_template="Q: {question} answer={answer} reference={reference}\n"
                                        "{transcript}", **kw)


async def test_a_job_configured_judge_scores_with_its_model_prompt_and_key(
        gateway, judge, monkeypatch) -> None:
    monkeypatch.setenv("LIBRA_TEST_JUDGE_KEY", "sk-local")
    reward = RewardSpec(name="llm_judge", llm_judge=judge_spec(
        judge.url, api_key_env="LIBRA_TEST_JUDGE_KEY"))
    assert (await gateway.client.score(score_input(reward, "4"))).reward == 1.0
    assert (await gateway.client.score(score_input(reward, "5"))).reward == 0.25
    first = judge.seen[0]
    assert (first["path"], first["body"]["model"], first["auth"]) == (
        "/v1/chat/completions", "grader-1", "Bearer sk-local")
    assert first["body"]["messages"][0]["content"] == (
        "Q: What is 2+2? answer=4 reference=4\nuser: What is 2+2?\nassistant: <ans>4</ans>")


async def test_the_judge_as_a_composite_component(gateway, judge) -> None:
    reward = RewardSpec(name="composite", llm_judge=judge_spec(judge.url), components=[
        RewardComponent(name="llm_judge", weight=0.5), RewardComponent(name="format")])
    out = await gateway.client.score(score_input(reward, "5"))
    assert out.components == {"llm_judge": 0.25, "format": 1.0}
    assert out.reward == pytest.approx(0.5 * 0.25 + 1.0)
    assert judge.seen[0]["auth"] == ""  # no api_key_env: no header


async def test_a_judge_without_an_endpoint_fails_naming_the_section(gateway) -> None:
    with pytest.raises(Internal, match=r"set \[reward.llm_judge\] base_url"):
        await gateway.client.score(score_input(RewardSpec(name="llm_judge"), "4"))
