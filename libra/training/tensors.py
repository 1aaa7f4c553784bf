"""Tensor helpers shared by the trainer, hybrid workers and the torch rollout engine:
weight checksums, the published weight format (tied tensors stored once), and padding.

Published format: a safetensors file of ``model.state_dict()`` names of the HF model (as
``save_pretrained``, the torch engine and vLLM load them), every tensor once. With tied
input/output embeddings (``config.tie_word_embeddings``: SmolLM2, Qwen3) the alias
(``lm_head.weight``) is left out and only its source (``model.embed_tokens.weight``) is
written; safetensors refuses two names over one storage anyway. A loader accepts exactly
that: every other key must be present, no key may be unknown, shapes must match, and the
alias may be absent (or present and equal to its source).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import torch


def state_checksum(model: torch.nn.Module) -> str:
    """sha256 over the full state dict (names and raw bytes, in name order).

    A sharded (FSDP2) tensor is gathered whole first: a collective, so every rank of the
    group must call this together.
    """
    from torch.distributed.tensor import DTensor

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """``{alias: source}`` of the model's tied tensors; empty when nothing is tied.

    transformers reports the tie only when the config asks for it (an untied Qwen2 gives
    ``{}``), so this follows ``config.tie_word_embeddings``.
    """
    expand = getattr(model, "get_expanded_tied_weights_keys", None)
    return dict(expand()) if callable(expand) else {}


def without_tied_aliases(model: torch.nn.Module,
                         state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` as published: each tied alias dropped (its source stays)."""
    aliases = tied_aliases(model)
    return {name: tensor for name, tensor in state.items() if name not in aliases}


def with_tied_aliases(model: torch.nn.Module,
                      state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A published ``state`` checked against ``model`` and completed for a strict load.

    Checks every name and shape before anything is loaded, so a refused file leaves the
    model untouched.

    Raises:
        ValueError: Naming the missing, unexpected or mis-shaped keys, or a tied alias
            that differs from its source.
    """
    expected = model.state_dict()
    aliases = tied_aliases(model)
    missing = [name for name in expected if name not in state and name not in aliases]
    unexpected = [name for name in state if name not in expected]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing keys {_names(missing)}, "
                         f"unexpected keys {_names(unexpected)}")
    complete = dict(state)
    for alias, source in aliases.items():
        if alias not in state:
            complete[alias] = state[source]
        elif not torch.equal(state[alias], state[source]):
            raise ValueError(f"tied weights differ: {alias} != {source}")
    misshaped = [f"{name} {tuple(tensor.shape)} != {tuple(expected[name].shape)}"
                 for name, tensor in complete.items()
                 if tuple(tensor.shape) != tuple(expected[name].shape)]
    if misshaped:
        raise ValueError(f"weights do not fit the model: shapes {_names(misshaped)}")
    return complete


def _names(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit]) or "none"
    return shown if len(names) <= limit else f"{shown} (+{len(names) - limit} more)"


def right_pad(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_token_id: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad (token_ids, loss_mask) pairs into ``[B, T]`` ids, attention and loss
    masks (on the CPU; the caller moves them to its device in one go)."""
    length = max(len(token_ids) for token_ids, _ in pairs)
    input_ids = torch.full((len(pairs), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(pairs), length), dtype=torch.long)
    loss_mask = torch.zeros((len(pairs), length), dtype=torch.float32)
    for index, (token_ids, mask) in enumerate(pairs):
        input_ids[index, : len(token_ids)] = torch.tensor(token_ids, dtype=torch.long)
        attention_mask[index, : len(token_ids)] = 1
        loss_mask[index, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
    return input_ids, attention_mask, loss_mask


def right_pad_floats(rows: Sequence[Sequence[float]]) -> torch.Tensor:
    """Right-pad float rows with 0 into a ``[B, T]`` tensor."""
    length = max(len(row) for row in rows)
    values = torch.zeros((len(rows), length), dtype=torch.float32)
    for index, row in enumerate(rows):
        values[index, : len(row)] = torch.tensor(list(row), dtype=torch.float32)
    return values


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` float32 log-prob of each token given its prefix; column 0 is 0.

    The softmax is float32 whatever the logits' dtype (bf16 under autocast), and the
    chosen token's log-prob is ``logit - logsumexp``: no ``[B, T, V]`` log-prob tensor is
    kept for backward, only the float32 logits.
    """
    logits = logits[:, :-1].float()
    picked = logits.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    picked = picked - torch.logsumexp(logits, dim=-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)
