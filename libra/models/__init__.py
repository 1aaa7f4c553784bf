"""Model builders: the tiny Llama-style policy and its tokenizer (torch, transformers)."""

from libra.models.tiny import (
    TinyModelConfig,
    build_model,
    build_tokenizer,
    encode_segments,
    load_model_dir,
    load_tokenizer,
    save_model_dir,
    stop_token_ids,
)

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
