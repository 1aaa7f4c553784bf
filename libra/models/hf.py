"""Hugging Face causal LMs from a local directory (torch, transformers; never the network).

One loader for every process that holds the policy: the trainer, the torch rollout
engine and ``libra export`` load the same directory the same way, so parameter names,
tied embeddings and dtypes agree everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """``auto`` is float32 on CPU and bfloat16 on CUDA; otherwise the named dtype."""
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return DTYPES[name]


def load_causal_lm(path: str, *, dtype: str = "auto", device: str = "cpu") -> PreTrainedModel:
    """Load the model in eval mode on ``device`` (offline: local files only)."""
    model = AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, dtype=resolve_dtype(dtype, device))
    return model.to(device).eval()


def load_tokenizer(path: str):
    """The directory's tokenizer (fast when available), offline."""
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def max_position_embeddings(path: str, default: int = 2048) -> int:
    """The context length a model directory's config.json declares."""
    config = json.loads((Path(path) / "config.json").read_text())
    return int(config.get("max_position_embeddings") or default)
