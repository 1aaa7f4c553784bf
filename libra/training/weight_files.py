"""What the torch trainer backend writes and reads: published weights (safetensors in
the engines' format) and the model/optimizer/RNG state of a checkpoint. Functions over
the model and optimizer the backend hands in (every rank calls them alike)."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from libra.training.parallel import (
    full_state_dict,
    load_full_state_dict,
    read_checkpoint,
    write_checkpoint,
)
from libra.training.tensors import with_tied_aliases, without_tied_aliases
from libra.weight_sync import sha256_file


def publish_weights(model: torch.nn.Module, publish_dtype: torch.dtype, rank: int,
                    path: str) -> str:
    """Write the weights as safetensors (see ``TorchTrainerBackend.save_weights``);
    returns the file's sha256, ``""`` on ranks other than 0 (they only gather)."""
    state_dict = without_tied_aliases(model, full_state_dict(model))
    if rank != 0:
        return ""
    bad = [name for name, tensor in state_dict.items()
           if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        raise ValueError(f"refusing to publish non-finite weights: {bad[:5]}")
    save_file({name: tensor.to(publish_dtype) if tensor.is_floating_point()
               else tensor for name, tensor in state_dict.items()}, path)
    return sha256_file(Path(path))


def load_weights(model: torch.nn.Module, path: str) -> None:
    """Load a file :func:`publish_weights` wrote into ``model`` (ValueError naming a bad key)."""
    state = with_tied_aliases(model, load_file(path))
    with torch.no_grad():  # every rank loads the whole file; FSDP2 keeps its shard
        load_full_state_dict(model, state)


def save_state(directory: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               rng: random.Random, num_steps: int, device: torch.device,
               rank: int) -> list[str]:
    """Model, optimizer and RNG state into ``directory``; returns the file names."""
    rng_state = {"torch_rng": torch.get_rng_state(), "python_rng": rng.getstate(),
                 "num_steps": num_steps}
    if device.type == "cuda":
        rng_state["cuda_rng"] = torch.cuda.get_rng_state(device)
    return write_checkpoint(Path(directory), model, optimizer, rng_state, rank)


def load_state(directory: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               rng: random.Random, device: torch.device) -> int:
    """Restore what :func:`save_state` wrote (RNGs included); returns the step count."""
    rng_state = read_checkpoint(Path(directory), model, optimizer)
    torch.set_rng_state(rng_state["torch_rng"])
    if "cuda_rng" in rng_state and device.type == "cuda":
        torch.cuda.set_rng_state(rng_state["cuda_rng"], device)
    rng.setstate(rng_state["python_rng"])
    return int(rng_state["num_steps"])
