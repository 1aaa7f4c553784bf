"""Data-parallel building blocks of the torch trainer backend: FSDP2 sharding, whole
(gathered) state dicts for saving, sharded loading, loss and metric reductions over ranks.

Used by :meth:`TorchTrainerBackend.enable_data_parallel` and its save/load methods; the
process group itself is formed in ``distributed.py``. Devices are the backend's business:
it places the model (CPU or ``cuda:<local rank>``) before any of these run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from libra.run_dir import CHECKPOINT_MODEL
from libra.training.tensors import with_tied_aliases, without_tied_aliases

PARALLELISMS = ("ddp", "fsdp2")


def is_sharded(model: torch.nn.Module) -> bool:
    """True once :func:`fully_shard_layers` has run (the parameters are DTensors)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def broadcast_from_rank0(model: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank (FSDP2 does not, unlike DDP)."""
    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def fully_shard_layers(model: PreTrainedModel, device_type: str) -> None:
    """FSDP2 over a 1-D mesh of all ranks: each decoder layer, then the root.

    Layer by layer means only one layer's full parameters exist at a time in forward and
    backward; the root takes the rest (embeddings, final norm, LM head).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def same_optimizer_over(optimizer: torch.optim.Optimizer,
                        model: torch.nn.Module) -> torch.optim.AdamW:
    """A fresh AdamW with ``optimizer``'s hyper-parameters over ``model``'s parameters."""
    if optimizer.state:
        raise RuntimeError("shard the model before the first optimizer step")
    group = optimizer.param_groups[0]
    return torch.optim.AdamW(model.parameters(), lr=group["lr"], betas=group["betas"],
                             eps=group["eps"], weight_decay=group["weight_decay"])


def _state_dict_options(**kwargs: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on CPU.

    Sharded (FSDP2): a collective every rank must join; only rank 0 gets the tensors (the
    others get ``{}``). Otherwise: this rank's own (detached) tensors.
    """
    if not is_sharded(model):
        return {name: tensor.detach().contiguous().cpu()
                for name, tensor in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_state_dict_options(cpu_offload=True))


def full_optimizer_state(model: torch.nn.Module,
                         optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state keyed by parameter name (DCP's full optimizer state dict).

    Sharded with state: DCP gathers it (a collective; only rank 0 gets it). Otherwise the
    optimizer's own state dict, renamed: DCP would first "initialise" an empty state with a
    zero-gradient step, which would change the following steps (Adam's step count).
    """
    if is_sharded(model) and optimizer.state:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer,
                                        options=_state_dict_options(cpu_offload=True))
    names = _parameter_names(model, optimizer)
    state = optimizer.state_dict()
    return {"state": {names[index]: value for index, value in state["state"].items()},
            "param_groups": [{**group, "params": [names[index] for index in group["params"]]}
                             for group in state["param_groups"]]}


def _parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each optimizer parameter, in the optimizer's (state-dict index) order."""
    by_id = {id(parameter): name for name, parameter in model.named_parameters()}
    return [by_id[id(parameter)] for group in optimizer.param_groups
            for parameter in group["params"]]


def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full state dict; a sharded model keeps only this rank's shard of it."""
    if not is_sharded(model):
        model.load_state_dict(state, strict=True)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, state, options=_state_dict_options(strict=True))


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         state: dict) -> None:
    """Load :func:`full_optimizer_state` output (or an index-keyed ``state_dict()``)."""
    if is_sharded(model) and state["state"]:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=_state_dict_options())
        return
    index = {name: i for i, name in enumerate(_parameter_names(model, optimizer))}
    if any(isinstance(key, str) for group in state["param_groups"] for key in group["params"]):
        state = {"state": {index[name]: value for name, value in state["state"].items()},
                 "param_groups": [{**group, "params": [index[name] for name in group["params"]]}
                                  for group in state["param_groups"]]}
    optimizer.load_state_dict(state)


# --- checkpoint files ---------------------------------------------------------------------

# The model file's name is shared with the init_from check (libra/run_dir.py).
CKPT_MODEL, CKPT_OPTIMIZER, CKPT_RNG = CHECKPOINT_MODEL, "optimizer.pt", "rng.pt"


def write_checkpoint(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     rng_state: dict, rank: int) -> list[str]:
    """Write the model (float32, tied tensors once as published), the optimizer state
    keyed by parameter name and ``rng_state``; returns the file names.

    Whole states, so a checkpoint loads into 1 rank, DDP or FSDP2 alike. With several
    ranks every rank must call this (FSDP2 gathers); only rank 0 writes, the others get
    ``[]``.
    """
    model_state = without_tied_aliases(model, full_state_dict(model))
    optimizer_state = full_optimizer_state(model, optimizer)
    if rank != 0:
        return []
    save_file(model_state, str(folder / CKPT_MODEL))
    torch.save(optimizer_state, folder / CKPT_OPTIMIZER)
    torch.save(rng_state, folder / CKPT_RNG)
    return [CKPT_MODEL, CKPT_OPTIMIZER, CKPT_RNG]


def read_checkpoint(folder: Path, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer) -> dict:
    """Load :func:`write_checkpoint`'s model and optimizer state; returns its RNG state.

    Under FSDP2 each rank keeps only its shard of the full state it read.

    Raises:
        ValueError: A file is unreadable or does not fit the model; names the file.
    """
    rng_state: dict = {}
    loaders = (
        (CKPT_MODEL, lambda path: load_full_state_dict(
            model, with_tied_aliases(model, load_file(str(path))))),
        (CKPT_OPTIMIZER, lambda path: load_optimizer_state(
            model, optimizer, torch.load(path, weights_only=False))),
        (CKPT_RNG, lambda path: rng_state.update(torch.load(path, weights_only=False))),
    )
    for name, load in loaders:
        try:
            with torch.no_grad():
                load(folder / name)
        except Exception as exc:
            raise ValueError(f"corrupt checkpoint file {folder / name}: {exc}") from exc
    return rng_state


# --- reductions over the ranks (identity on one rank) ---------------------------------

def reduce_loss(loss: torch.Tensor, num_tokens: float,
                world: int) -> tuple[torch.Tensor, float, bool]:
    """(loss to backward, global loss value, finite on every rank).

    This rank's loss is its shard's token mean; scaled by ``world * n_local / n_total``
    the DDP gradient average equals the gradient of the global token mean. The stats
    travel as a CPU tensor (gloo, also in the CUDA group's ``cpu:gloo`` half).
    """
    finite = bool(torch.isfinite(loss))
    if world == 1:
        return loss, float(loss.detach()), finite
    stats = torch.tensor([num_tokens, float(loss.detach()) * num_tokens if finite else 0.0,
                          0.0 if finite else 1.0], dtype=torch.float64)
    dist.all_reduce(stats)
    total = float(stats[0])
    scale = world * num_tokens / total if total > 0 else 0.0
    return loss * scale, float(stats[1]) / max(total, 1.0), float(stats[2]) == 0.0


def reduce_metrics(metrics: dict[str, float], num_tokens: float,
                   world: int) -> dict[str, float]:
    """Token-weighted mean of per-shard token-mean metrics; ``num_tokens`` summed."""
    if world == 1:
        return {**metrics, "num_tokens": num_tokens}
    names = sorted(metrics)
    values = torch.tensor([metrics[name] * num_tokens for name in names] + [num_tokens],
                          dtype=torch.float64)
    dist.all_reduce(values)
    total = float(values[-1])
    reduced = {name: float(values[i]) / max(total, 1.0) for i, name in enumerate(names)}
    return {**reduced, "num_tokens": total}


def max_over_ranks(values: list[float], world: int) -> list[float]:
    """Each value's maximum over the ranks (e.g. the slowest rank's time)."""
    if world == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [float(value) for value in tensor]
