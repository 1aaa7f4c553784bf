"""Unit tests for the batched KV-cache decode loop of the CPU engine."""

import json
import threading

import pytest
import torch

from libra.models import (
    TinyModelConfig,
    build_model,
    build_tokenizer,
    load_tokenizer,
    save_model_dir,
)
from services.rollout.engine_types import GenerationRequest
from services.rollout.torch_engine import TorchEngine

_CFG = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _engine(seed=0):
    return TorchEngine(build_model(_CFG, seed=seed), pad_token_id=0, num_threads=1)


def _request(tokenizer, text, **overrides):
    fields = dict(prompt_token_ids=tokenizer(text)["input_ids"], max_new_tokens=8, seed=11)
    fields.update(overrides)
    return GenerationRequest(**fields)


def test_seeded_sample_does_not_depend_on_batch_mates(tokenizer):
    engine = _engine()
    alone = engine.generate([_request(tokenizer, "Q:1+2=")])[0]
    batched = engine.generate(
        [_request(tokenizer, "Q:12*34-5=<calc>", seed=3), _request(tokenizer, "Q:1+2=")]
    )
    assert batched[1].token_ids == alone.token_ids
    assert batched[1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_logprobs_equal_full_forward_policy_logprobs(tokenizer):
    engine = _engine()
    request = _request(tokenizer, "Q:7-3=", temperature=1.7, top_p=0.9)
    result = engine.generate([request])[0]
    full_ids = torch.tensor([request.prompt_token_ids + result.token_ids])
    with torch.no_grad():
        logits = engine._model(input_ids=full_ids).logits[0]
    start = len(request.prompt_token_ids) - 1
    expected = [
        torch.log_softmax(logits[start + i], -1)[token].item()
        for i, token in enumerate(result.token_ids)
    ]
    assert result.logprobs == pytest.approx(expected, abs=1e-5)


def test_stop_token_ends_the_row_and_is_kept(tokenizer):
    engine = _engine()
    greedy = engine.generate([_request(tokenizer, "Q:5=", temperature=0.0)])[0]
    stop_id = greedy.token_ids[2]
    stopped = engine.generate(
        [_request(tokenizer, "Q:5=", temperature=0.0, stop_token_ids=[stop_id])]
    )[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids[-1] == stop_id
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 8


def test_abort_keeps_tokens_generated_so_far(tokenizer):
    engine = _engine()
    original_forward = engine._forward
    calls = []

    def forward_then_abort(*args):
        calls.append(1)
        if len(calls) == 3:
            engine.abort()
        return original_forward(*args)

    engine._forward = forward_then_abort
    result = engine.generate([_request(tokenizer, "Q:5=", max_new_tokens=20)])[0]
    assert result.finish_reason == "aborted"
    # Forwards: prefill, token 1, token 2 (abort raised here, so no third sample).
    assert len(result.token_ids) == 2 and len(result.logprobs) == 2
    engine._forward = original_forward
    assert engine.generate([_request(tokenizer, "Q:5=")])[0].finish_reason == "length"


def test_abort_rows_stops_only_those_rows_and_the_rest_carry_on(tokenizer):
    engine = _engine()
    requests = [_request(tokenizer, "Q:5=", max_new_tokens=20),
                _request(tokenizer, "Q:12*34-5=<calc>", seed=3)]
    alone = engine.generate([requests[1]])[0]
    original_forward = engine._forward
    calls = []

    def forward_then_abort_row(*args):
        calls.append(1)
        if len(calls) == 3:
            engine.abort_rows([0])
        return original_forward(*args)

    engine._forward = forward_then_abort_row
    stopped, carried_on = engine.generate(requests)
    assert stopped.finish_reason == "aborted" and len(stopped.token_ids) == 2
    assert carried_on.finish_reason == "length" and carried_on.token_ids == alone.token_ids
    # The stop is for the call in flight only.
    engine._forward = original_forward
    assert engine.generate(requests[:1])[0].finish_reason == "length"


def test_abort_from_another_thread_interrupts_generation(tokenizer):
    engine = _engine()
    timer = threading.Timer(0.05, engine.abort)
    timer.start()
    result = engine.generate([_request(tokenizer, "Q:5=", max_new_tokens=100000)])[0]
    timer.join()
    assert result.finish_reason == "aborted" and 0 < len(result.token_ids) < 100000


def test_load_weights_replaces_weights_and_sets_version(tokenizer, tmp_path):
    source, target = build_model(_CFG, seed=1), _engine(seed=2)
    save_model_dir(source, tokenizer, str(tmp_path))
    target.load_weights(str(tmp_path / "model.safetensors"), version=7)
    expected = TorchEngine(source, pad_token_id=0).generate([_request(tokenizer, "Q:9=")])[0]
    assert target.policy_version == 7
    assert target.generate([_request(tokenizer, "Q:9=")])[0].token_ids == expected.token_ids


def test_zero_max_new_tokens_returns_empty_length_result(tokenizer):
    result = _engine().generate([_request(tokenizer, "Q:1=", max_new_tokens=0)])[0]
    assert result.token_ids == [] and result.finish_reason == "length"


def test_tokenizer_round_trips_protocol_text_and_tags_are_single_tokens(tokenizer, tmp_path):
    text = "Q:33-4*7=<calc>33-4*7</calc><err>busy</err><calc>33-4*7</calc><res>5</res><ans>5</ans>"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids[1:]) == text
    for tag in ("<calc>", "</calc>", "<res>", "</res>", "<err>", "</err>", "<ans>", "</ans>"):
        assert len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1
    assert tokenizer("~", add_special_tokens=False)["input_ids"] == [tokenizer.unk_token_id]
    save_model_dir(build_model(_CFG, seed=0), tokenizer, str(tmp_path))
    assert load_tokenizer(str(tmp_path))(text)["input_ids"] == ids


def test_turn_interrupted_by_a_weight_update_resumes_on_the_new_weights(tokenizer, tmp_path):
    """Partial rollout with the real engine: one turn, tokens from versions 0 and 1."""
    from safetensors.torch import save_file

    from libra import types as t
    from libra.jobspec import JobSpec, TaskSpec
    from services.rollout import agent
    from services.rollout.backend import HfTokenizer

    engine = _engine(seed=0)
    new_model = build_model(_CFG, seed=1)
    weights = tmp_path / "v1.safetensors"
    save_file({k: v.contiguous() for k, v in new_model.state_dict().items()}, str(weights))
    spec = JobSpec(task=TaskSpec(max_new_tokens_per_turn=12))
    tok = HfTokenizer(tokenizer, [], 384)  # no stop tokens: the turn runs to its budget
    traj = t.Trajectory(t.TrajectoryId("tr"), t.JobId("j"), t.GroupId("g"), t.PromptId("p"),
                        "Q:1+2=", "3")
    loop = agent.ArithAgent(spec, tok)
    loop.stop_strings = []  # nor stop tags: the turn runs to its budget
    loop.start(traj)
    original_forward = engine._forward
    calls = []

    def forward_then_abort(*args):
        calls.append(1)
        if len(calls) == 5:
            engine.abort()  # as the rollout core's watcher does when v1 is published
        return original_forward(*args)

    engine._forward = forward_then_abort
    first = engine.generate([loop.next_request(traj, seed=5)])[0]
    assert first.finish_reason == "aborted" and len(first.token_ids) == 4
    agent.apply_partial(traj, first)
    engine._forward = original_forward
    engine.load_weights(str(weights), version=1)
    rest = loop.next_request(traj, seed=5, num_turn_tokens=4)
    assert rest.max_new_tokens == 8 and rest.prompt_token_ids == traj.token_ids
    second = engine.generate([rest])[0]
    loop.apply_generation(traj, second, turn_prefix=first.token_ids)
    assert traj.num_turns == 1
    model_versions = [v for v, m in zip(traj.token_versions, traj.loss_mask, strict=True) if m]
    assert model_versions == [0] * 4 + [1] * 8
    # The resumed tokens' log-probs are the new policy's on the full context.
    ids = torch.tensor([traj.token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(new_model.eval()(input_ids=ids).logits[0, :-1].float(), -1)
    end = len(traj.token_ids)
    expected = [float(logprobs[i - 1, traj.token_ids[i]]) for i in range(end - 8, end)]
    assert traj.logprobs[-8:] == pytest.approx(expected, abs=1e-4)


def test_every_call_is_recorded_with_its_shape_and_wall_time(tokenizer):
    from services.rollout.engine_types import EngineCallLog

    log = EngineCallLog(maxlen=2)
    engine = TorchEngine(build_model(_CFG, seed=0), pad_token_id=0, call_log=log)
    short, long_ = _request(tokenizer, "Q:1="), _request(tokenizer, "Q:12*34-5=<calc>")
    results = engine.generate([short, long_])
    (call,) = log.calls()
    assert (call.batch, call.prompt_len) == (2, len(long_.prompt_token_ids))
    assert call.prompt_tokens == len(short.prompt_token_ids) + len(long_.prompt_token_ids)
    assert call.new_tokens == sum(len(r.token_ids) for r in results)
    # One prefill forward, then one decode forward per token of the longest row after
    # its first.
    assert call.decode_steps == max(len(r.token_ids) for r in results) - 1
    assert call.wall_s > 0 and not call.aborted
    for _ in range(3):
        engine.generate([short])
    assert len(log.calls()) == 2  # a ring buffer: the oldest calls go
    rows = json.loads(log.to_json())
    assert rows[0]["batch"] == 1 and set(rows[0]) >= {"at_s", "wall_s", "decode_steps"}


def test_the_token_sink_gets_each_steps_tokens_as_they_are_sampled(tokenizer):
    engine = _engine()
    steps = []
    engine.token_sink = steps.append
    requests = [_request(tokenizer, "Q:5=", max_new_tokens=3),
                _request(tokenizer, "Q:12*34-5=<calc>", seed=3, max_new_tokens=5)]
    short, long = engine.generate(requests)
    assert [len(step) for step in steps] == [2, 2, 2, 1, 1]  # the short row ended
    assert [t for step in steps for row, t in step if row == 0] == short.token_ids
    assert [t for step in steps for row, t in step if row == 1] == long.token_ids
