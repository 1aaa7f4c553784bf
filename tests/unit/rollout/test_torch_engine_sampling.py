"""The torch engine's vectorised sampler and incremental stop-string matcher."""

from __future__ import annotations

import pytest
import torch

from services.rollout.engine_types import GenerationRequest
from services.rollout.torch_sampling import BatchSampler, StopStringMatcher

_LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
_CPU = torch.device("cpu")


def _frequencies(rows: int, steps: int, logits: torch.Tensor, **params) -> torch.Tensor:
    """Empirical token frequencies of ``rows`` seeded rows sampled ``steps`` times."""
    requests = [GenerationRequest(prompt_token_ids=[1], max_new_tokens=steps, seed=row,
                                  **params) for row in range(rows)]
    generators = [torch.Generator().manual_seed(row) for row in range(rows)]
    sampler = BatchSampler(requests, generators, _CPU)
    counts = torch.zeros(logits.shape[-1])
    for _ in range(steps):
        token_ids, _logprobs = sampler.sample(logits.expand(rows, -1).clone())
        counts += torch.bincount(token_ids, minlength=logits.shape[-1])
    return counts / counts.sum()


def test_samples_follow_the_tempered_softmax():
    observed = _frequencies(2000, 8, _LOGITS, temperature=0.7)
    assert observed.tolist() == pytest.approx(torch.softmax(_LOGITS / 0.7, -1).tolist(),
                                              abs=0.015)


def test_top_p_samples_only_the_nucleus_renormalised():
    probs = torch.softmax(_LOGITS / 1.5, -1)  # 0.42, 0.22, 0.16, 0.11, ...
    observed = _frequencies(2000, 8, _LOGITS, temperature=1.5, top_p=0.7)
    # Mass before the 3rd token is 0.64 < 0.7: it is kept; before the 4th it is 0.80.
    nucleus = probs[:3] / probs[:3].sum()
    assert observed[3:].sum().item() == 0.0
    assert observed[:3].tolist() == pytest.approx(nucleus.tolist(), abs=0.015)


def test_a_tiny_top_p_is_greedy_and_masked_tokens_are_never_drawn():
    assert _frequencies(64, 4, _LOGITS, top_p=1e-6)[0].item() == 1.0
    masked = torch.tensor([0.0, float("-inf"), 0.0, float("-inf")])
    observed = _frequencies(500, 4, masked, temperature=2.0)
    assert observed[1].item() == observed[3].item() == 0.0


def test_log_probs_are_the_temperature_one_policy_and_greedy_takes_the_argmax():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 4
    requests = [GenerationRequest(prompt_token_ids=[1], max_new_tokens=1, temperature=0.0),
                GenerationRequest(prompt_token_ids=[1], max_new_tokens=1, temperature=0.3),
                GenerationRequest(prompt_token_ids=[1], max_new_tokens=1, top_p=0.5)]
    generators = [torch.Generator().manual_seed(i) for i in range(3)]
    token_ids, logprobs = BatchSampler(requests, generators, _CPU).sample(logits)
    assert token_ids[0].item() == logits[0].argmax().item()
    expected = torch.log_softmax(logits, -1).gather(1, token_ids.unsqueeze(1)).squeeze(1)
    assert logprobs.tolist() == pytest.approx(expected.tolist(), abs=1e-6)


def test_a_row_stream_depends_only_on_its_seed():
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(1))

    def draws(seeds: list[int]) -> list[int]:
        requests = [GenerationRequest(prompt_token_ids=[1], max_new_tokens=99, seed=seed)
                    for seed in seeds]
        sampler = BatchSampler(requests, [torch.Generator().manual_seed(s) for s in seeds],
                               _CPU)
        return [sampler.sample(logits.expand(len(seeds), -1).clone())[0][-1].item()
                for _ in range(150)]  # past two blocks of uniforms

    assert draws([7]) == draws([3, 9, 7]) != draws([8])


# -- stop strings --------------------------------------------------------------------------------
_BYTES = {1: b"ab", 2: b"c", 3: b"d</", 4: b"ans>", 5: b"\xc3", 6: b"\xa9", 7: b"!"}


def _decode(token_ids: list[int]) -> str:
    """A byte-level tokenizer's decode: bytes joined, broken UTF-8 replaced."""
    return b"".join(_BYTES[token] for token in token_ids).decode("utf-8", errors="replace")


def _first_stop(stop_strings: list[str], tokens: list[int]) -> int | None:
    matcher = StopStringMatcher(stop_strings, _decode)
    for count in range(1, len(tokens) + 1):
        if matcher.completed_by_last(tokens[:count]):
            return count
    return None


def test_a_stop_string_spanning_tokens_stops_at_the_completing_token():
    assert _first_stop(["</ans>"], [1, 2, 3, 4, 1]) == 4
    assert _first_stop(["bc"], [1, 2, 3]) == 2
    assert _first_stop(["zz"], [1, 2, 3, 4]) is None


def test_a_character_split_over_tokens_is_matched_once_whole():
    assert _first_stop(["\u00e9!"], [1, 5, 6, 7]) == 4
    assert _first_stop(["\u00e9"], [1, 5, 6, 7]) == 3  # not at the half character
    matcher = StopStringMatcher(["never"], _decode)
    tokens = [1, 5, 6, 2, 3, 4]
    for count in range(1, len(tokens) + 1):
        matcher.completed_by_last(tokens[:count])
    assert matcher.text == _decode(tokens)
