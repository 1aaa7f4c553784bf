"""Data parallel over a tied-embedding HF model: 2 gloo ranks on CPU (spawned) against one
rank. The tie must survive FSDP2 sharding (the embedding then gets the output
head's gradient too) and the published file must hold it once."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from libra.training.samples import TrainSample


def _samples() -> list[TrainSample]:
    samples = []
    for index in range(4):
        ids = [5 + (index * 7 + t) % 50 for t in range(10 + index)]
        samples.append(TrainSample(
            token_ids=ids, loss_mask=[0] * 3 + [1] * (len(ids) - 3),
            rollout_logprobs=[0.0] * 3 + [-3.0] * (len(ids) - 3),
            advantage=1.0 if index % 2 else -1.0, group_id="g", trajectory_id=f"t{index}"))
    return samples


def _backend(model_dir: str):
    from libra.models.hf import load_causal_lm
    from libra.training.torch_backend import TorchTrainerBackend

    return TorchTrainerBackend(load_causal_lm(model_dir), pad_token_id=0, learning_rate=1e-2,
                               device="cpu")


def _rank_main(rank: int, model_dir: str, port: int, parallelism: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        backend = _backend(model_dir)
        backend.enable_data_parallel(parallelism, "cpu")
        backend.train_step(_samples())
        backend.save_weights(os.path.join(out, "published.safetensors"))
        os.makedirs(os.path.join(out, "ckpt"), exist_ok=True)
        backend.save_checkpoint(os.path.join(out, "ckpt"))
        dist.barrier()  # rank 0 writes; every rank reads
        backend.load_checkpoint(os.path.join(out, "ckpt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_fsdp2_ranks_train_a_tied_model_like_one_rank(hf_model_dir, tmp_path):
    """FSDP2 only (DDP keeps whole modules, so the tie is not at risk; ~10 s per spawn)."""
    model_dir = str(hf_model_dir("llama"))
    mp.spawn(_rank_main, args=(model_dir, _free_port(), "fsdp2", str(tmp_path)), nprocs=2)
    single = _backend(model_dir)
    single.train_step(_samples())
    single.save_weights(str(tmp_path / "single.safetensors"))
    ranks, one = (load_file(str(tmp_path / name))
                  for name in ("published.safetensors", "single.safetensors"))
    assert sorted(ranks) == sorted(one) and "lm_head.weight" not in ranks
    # The first Adam step moves each weight by ~lr (1e-2): a lost head gradient would show.
    worst = max(float((ranks[name] - one[name]).abs().max()) for name in one)
    assert worst < 1e-3, worst
    checkpoint = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert torch.equal(checkpoint["model.embed_tokens.weight"],
                       ranks["model.embed_tokens.weight"])
