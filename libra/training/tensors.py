"""Tensor helpers shared by the trainer and hybrid workers: weight checksums."""

from __future__ import annotations

import hashlib

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
