"""Data-parallel building blocks of the torch trainer backend: FSDP2 sharding, whole
(gathered) state dicts for saving, sharded loading, and the GPU placement hook.

Used by :meth:`TorchTrainerBackend.enable_data_parallel` and its save/load methods; the
process group itself is formed in ``distributed.py``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

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


# --- GPU path: wired for trainer ranks on CUDA, exercised only where CUDA is present ---

def place_on_device(model: torch.nn.Module, device: torch.device) -> None:
    """Move the model to ``device``; its inputs follow, its logits come back to the CPU.

    The batches (``_right_pad``) and the loss stay on the CPU: a forward pre-hook moves the
    tensor arguments to the device and a forward hook returns the logits on the CPU
    (autograd carries the gradient back across). Cheap for the tiny vocabulary; a large
    model would keep the loss on the device instead.
    """
    model.to(device)

    def inputs_to_device(_module: torch.nn.Module, args: tuple,
                         kwargs: dict) -> tuple[tuple, dict]:
        return (tuple(_to(value, device) for value in args),
                {name: _to(value, device) for name, value in kwargs.items()})

    def logits_to_cpu(_module: torch.nn.Module, _args: tuple, _kwargs: dict,
                      output: object) -> object:
        output.logits = output.logits.cpu()
        return output

    model.register_forward_pre_hook(inputs_to_device, with_kwargs=True)
    model.register_forward_hook(logits_to_cpu, with_kwargs=True)


def _to(value: object, device: torch.device) -> object:
    return value.to(device) if isinstance(value, torch.Tensor) else value
