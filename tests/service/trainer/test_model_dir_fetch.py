"""The rollout's fetch of a job's model directory from the trainer's WeightService, over
real gRPC, and an engine built from the copy (the weights' fetch is in
test_weight_service.py).

Real parts: the grpc.aio server on a loopback port, the typed client, the fetcher writing
to a real cache directory, the torch engine loader.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import torch

from libra import types as t
from libra.errors import InvalidArgument
from services.rollout.backend import TorchEngineLoader
from services.rollout.weight_fetcher import WeightSource
from tests.service.trainer.weight_rig import JOB, fetcher, first_chunk


async def test_the_model_dir_is_fetched_byte_exact(serve, tmp_path: Path) -> None:
    trainer, client = await serve()
    folder = await fetcher(client, tmp_path).fetch_model_dir(JOB)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == trainer.model_files


async def test_a_model_file_already_here_is_not_fetched_again(serve, tmp_path: Path) -> None:
    trainer, client = await serve()
    fetch = fetcher(client, tmp_path)
    folder = await fetch.fetch_model_dir(JOB)
    before = (folder / "model.safetensors").stat().st_mtime_ns
    (folder / "config.json").write_bytes(b"{}")  # a stale copy is replaced
    await fetch.fetch_model_dir(JOB)
    assert (folder / "model.safetensors").stat().st_mtime_ns == before
    assert (folder / "config.json").read_bytes() == trainer.model_files["config.json"]


async def test_auto_source_fetches_the_model_dir_only_when_not_shared(serve,
                                                                     tmp_path: Path) -> None:
    trainer, client = await serve()
    source = WeightSource("auto", fetcher(client, tmp_path))
    shared = str(trainer.run_dir / "model")
    here = await source.model_dir(JOB, t.PolicyInfo(1, "", trainer.digest, shared, 0))
    assert here == shared and not (tmp_path / "cache").exists()
    elsewhere = str(tmp_path / "elsewhere" / "model")
    fetched = await source.model_dir(JOB, t.PolicyInfo(1, "", trainer.digest, elsewhere, 0))
    assert fetched == str(tmp_path / "cache" / JOB / "model")


@pytest.mark.parametrize("name", ["../v000001.safetensors", "", "model/x"])
async def test_a_model_file_outside_the_model_dir_is_refused(serve, name: str) -> None:
    _, client = await serve()
    with pytest.raises(InvalidArgument) as raised:
        await first_chunk(client.fetch_model_file(JOB, name))
    assert raised.value.field == "name"



async def test_an_engine_is_built_from_a_fetched_model_dir(serve, tmp_path: Path,
                                                           hf_model_dir) -> None:
    trainer, client = await serve()
    original = hf_model_dir("llama")
    shutil.rmtree(trainer.run_dir / "model")
    shutil.copytree(original, trainer.run_dir / "model")
    folder = await fetcher(client, tmp_path).fetch_model_dir(JOB)
    loader = TorchEngineLoader()
    engine, tokenizer = await asyncio.to_thread(loader.load, str(folder), None)
    reference, reference_tokenizer = await asyncio.to_thread(loader.load, str(original), None)
    fetched, expected = engine._model.state_dict(), reference._model.state_dict()
    assert fetched.keys() == expected.keys()
    assert all(torch.equal(fetched[k], expected[k]) for k in expected)
    assert tokenizer.encode("2+2=4") == reference_tokenizer.encode("2+2=4")
