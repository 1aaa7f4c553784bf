"""Batched token sampling and stop-string detection for :class:`TorchEngine`.

Sampling is one set of tensor ops per decode step for the whole batch, on the model's
device: greedy rows take the argmax, the others draw by inverse CDF from the tempered
softmax (rows with ``top_p < 1`` over their sorted nucleus). The rows are split into
greedy / plain / nucleus groups once per call (the requests fix them), so a step never
asks the device which path a row takes.

Reproducibility: every row's randomness is its own stream of uniforms, drawn on the CPU
from its request's ``torch.Generator`` (the engine's shared one for requests without a
seed) in blocks of :data:`UNIFORM_BLOCK` per row and copied to the device once per block.
A row's stream depends only on its seed and its step index, so a seeded row samples the
same tokens whatever its batch mates, whether the engine runs on CPU or CUDA (up to the
device's own rounding of the probabilities), and an aborted turn is a prefix of the
uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from services.rollout.engine_types import GenerationRequest

UNIFORM_BLOCK = 64
"""Uniforms drawn per row at once: one host-to-device copy every this many steps."""

NUCLEUS_CANDIDATES = (64, 1024)
"""Top-k sizes tried (on CPU) before a full sort of the vocabulary for top-p rows."""


@dataclass(frozen=True, slots=True)
class _RowGroup:
    """Rows sampled the same way; ``index`` is None when the group is the whole batch."""

    index: torch.Tensor | None
    temperature: torch.Tensor  # [n, 1]
    top_p: torch.Tensor  # [n, 1]
    unit_temperature: bool  # every row at temperature 1: reuse the untempered weights

    def take(self, values: torch.Tensor) -> torch.Tensor:
        return values if self.index is None else values.index_select(0, self.index)


def _group(rows: list[int], requests: Sequence[GenerationRequest],
           device: torch.device) -> _RowGroup | None:
    if not rows:
        return None
    index = None if len(rows) == len(requests) else torch.tensor(rows, device=device)
    temperature = torch.tensor([[requests[i].temperature] for i in rows], device=device)
    top_p = torch.tensor([[requests[i].top_p] for i in rows], device=device)
    unit = all(requests[i].temperature == 1.0 for i in rows)
    return _RowGroup(index, temperature, top_p, unit)


class UniformStreams:
    """One uniform in [0, 1) per row and step, from each row's own CPU generator.

    Rows whose generator is None (greedy rows) get 0 and consume nothing.
    """

    def __init__(self, generators: Sequence[torch.Generator | None],
                 device: torch.device) -> None:
        self._generators = list(generators)
        self._device = device
        self._block = torch.empty(0)
        self._column = UNIFORM_BLOCK

    def next(self) -> torch.Tensor:
        """The ``[B]`` float32 uniforms of the next step, on the device."""
        if self._column == UNIFORM_BLOCK:
            # Pinned on CUDA so that the copy is asynchronous (no wait for the device).
            block = torch.zeros((len(self._generators), UNIFORM_BLOCK), dtype=torch.float32,
                                pin_memory=self._device.type == "cuda")
            for row, generator in enumerate(self._generators):
                if generator is not None:
                    block[row] = torch.rand(UNIFORM_BLOCK, generator=generator)
            self._block = block.to(self._device, non_blocking=True)
            self._column = 0
        column = self._block[:, self._column]
        self._column += 1
        return column


class BatchSampler:
    """Samples one token per row from ``[B, V]`` float32 logits.

    Args:
        requests: The call's requests (temperature, top_p per row).
        generators: Each row's generator (its request's, or the engine's shared one).
        device: Where the logits live.
    """

    def __init__(self, requests: Sequence[GenerationRequest],
                 generators: Sequence[torch.Generator], device: torch.device) -> None:
        plain = [i for i, r in enumerate(requests) if r.temperature > 0 and r.top_p >= 1.0]
        nucleus = [i for i, r in enumerate(requests) if r.temperature > 0 and r.top_p < 1.0]
        self._plain = _group(plain, requests, device)
        self._nucleus = _group(nucleus, requests, device)
        sampled = set(plain) | set(nucleus)
        self._uniforms = UniformStreams(
            [g if i in sampled else None for i, g in enumerate(generators)], device
        ) if sampled else None

    def sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids ``[B]`` int64, their temperature-1 log-probs ``[B]`` float32).

        One pass each for the max, the shifted exponentials and their sum serves both
        the log-probs and (at temperature 1) the sampling weights: the inverse CDF takes
        unnormalised weights, so no softmax division and no second exponential.
        """
        row_max, token_ids = logits.max(dim=-1, keepdim=True)  # argmax: the greedy rows
        shifted = logits - row_max
        weights = shifted.exp()
        if self._uniforms is not None:
            uniforms = self._uniforms.next().unsqueeze(1)
            for group, draw in ((self._plain, _draw_plain), (self._nucleus, _draw_nucleus)):
                if group is None:
                    continue
                group_weights = (group.take(weights) if group.unit_temperature
                                 else (group.take(shifted) / group.temperature).exp())
                drawn = draw(group_weights, group.take(uniforms), group.top_p)
                token_ids = drawn if group.index is None else token_ids.index_copy(
                    0, group.index, drawn)
        log_normaliser = weights.sum(dim=-1, keepdim=True).log()
        logprobs = shifted.gather(1, token_ids) - log_normaliser
        return token_ids.squeeze(1), logprobs.squeeze(1)


def _draw_plain(weights: torch.Tensor, uniforms: torch.Tensor,
                _top_p: torch.Tensor) -> torch.Tensor:
    """Inverse CDF over the vocabulary in id order (no sort needed); ``[n, 1]`` ids."""
    return _inverse_cdf(weights.cumsum(dim=-1), uniforms, mass=None)


def _draw_nucleus(weights: torch.Tensor, uniforms: torch.Tensor,
                  top_p: torch.Tensor) -> torch.Tensor:
    """Inverse CDF over the smallest most-probable prefix whose mass reaches ``top_p``.

    The prefix needs the weights in descending order. A full sort of a 50k-152k
    vocabulary costs ~3 ms per row on a CPU core, so on the CPU the top 64, then 1024
    candidates are tried first (``topk`` is sorted too); they serve when they already
    hold ``top_p`` of every row's mass, which is one host check per try. On CUDA the
    sort is cheap and the check would be a device sync: sort at once.
    """
    threshold = top_p * weights.sum(dim=-1, keepdim=True)
    vocab_size = weights.shape[-1]
    tries = NUCLEUS_CANDIDATES if weights.device.type == "cpu" else ()
    for count in tries:
        if count >= vocab_size:
            break
        top_weights, top_ids = torch.topk(weights, count, dim=-1)
        if bool((top_weights.sum(dim=-1, keepdim=True) >= threshold).all()):
            return _draw_sorted(top_weights, top_ids, uniforms, threshold)
    sorted_weights, sorted_ids = torch.sort(weights, dim=-1, descending=True)
    return _draw_sorted(sorted_weights, sorted_ids, uniforms, threshold)


def _draw_sorted(sorted_weights: torch.Tensor, sorted_ids: torch.Tensor,
                 uniforms: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Inverse CDF over the prefix of descending weights whose mass before each token is
    below ``threshold`` (the first token always qualifies)."""
    cdf = sorted_weights.cumsum(dim=-1)
    kept = ((cdf - sorted_weights) < threshold).sum(dim=-1, keepdim=True)
    position = _inverse_cdf(cdf, uniforms, mass=cdf.gather(1, kept - 1))
    return sorted_ids.gather(1, position)


def _inverse_cdf(cdf: torch.Tensor, uniforms: torch.Tensor,
                 mass: torch.Tensor | None) -> torch.Tensor:
    """``[n, 1]``: first position whose cumulative weight exceeds ``u * mass`` (mass:
    the last column, i.e. the whole row).

    ``u * mass`` may round up to ``mass`` itself; the position is then capped at the
    first one reaching ``mass``, which carries weight, so a token of zero probability
    (filtered out or underflowed) is never chosen.
    """
    mass = (cdf[:, -1:] if mass is None else mass).contiguous()
    position = torch.searchsorted(cdf, uniforms * mass, right=True)
    last_with_mass = torch.searchsorted(cdf, mass, right=False)
    return torch.minimum(position, last_with_mass)


class StopStringMatcher:
    """Whether a row's stop strings occur in the text of its new tokens.

    Decodes incrementally (as vLLM's detokenizer does): each step decodes only the
    tokens since the previous emitted text, with one token of context before them, and
    holds text back while it ends in an incomplete UTF-8 character (U+FFFD). The search
    covers the new text plus the longest stop string's length before it, so a match
    spanning tokens is found on the step that completes it.
    """

    def __init__(self, stop_strings: Sequence[str],
                 decode: Callable[[list[int]], str]) -> None:
        self._stop_strings = list(stop_strings)
        self._longest = max(len(stop) for stop in self._stop_strings)
        self._decode = decode
        self._text = ""
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix_text = ""

    def completed_by_last(self, token_ids: list[int]) -> bool:
        """Call once per appended token with all the row's new tokens so far."""
        new_text = self._decode(token_ids[self._prefix_offset:])
        if len(new_text) <= len(self._prefix_text) or new_text.endswith("\ufffd"):
            return False
        delta = new_text[len(self._prefix_text):]
        self._prefix_offset, self._read_offset = self._read_offset, len(token_ids)
        self._prefix_text = self._decode(token_ids[self._prefix_offset:self._read_offset])
        self._text += delta
        window = self._text[-(len(delta) + self._longest - 1):]
        return any(stop in window for stop in self._stop_strings)

    @property
    def text(self) -> str:
        """The text emitted so far."""
        return self._text
