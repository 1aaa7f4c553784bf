"""Model builders: the tiny Llama-style policy and its tokenizer (torch, transformers).

The names below load ``libra.models.tiny`` (and with it torch and transformers, seconds of
CPU) on first use, not when the package is imported: ``libra.models.hf_dir`` and the
other submodules are imported by processes that never build a model.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "TinyModelConfig",
    "build_model",
    "build_tokenizer",
    "encode_segments",
    "load_model_dir",
    "load_tokenizer",
    "save_model_dir",
    "stop_token_ids",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("libra.models.tiny"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
