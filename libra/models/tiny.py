"""The tiny Llama-style policy of the demo loop and its character-level tokenizer.

"Character-level" with one exception: each pair of digits is one token (see
``DIGIT_PAIRS``).

Everything is built locally (no download): the tokenizer from a fixed vocabulary, the
model from a seeded random init. The trainer builds and warm-starts the model; rollout
workers load the saved directory and later receive weights as safetensors files.

Tokenization contract for every caller: encode the prompt with
``add_special_tokens=True`` (this prepends ``<bos>``), and every later piece (generated
turns, tool outputs) with ``add_special_tokens=False``. Protocol tags are single tokens and
every piece boundary falls next to a tag, so encoding pieces one by one gives the same
ids as encoding their concatenation.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from libra.tasks.arith import TAGS, Segment

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
# Everything a prompt (``Q:...=``), a calculator result or an error message can contain.
CHARACTERS: tuple[str, ...] = tuple(
    string.digits + "+-*()=: " + string.ascii_lowercase + string.ascii_uppercase + ".,_/?!'\"#"
)
# Digit pairs ("00".."99") are single tokens: numbers take half as many tokens and the
# copies of expressions and tool results the policy must make become shorter and less
# ambiguous (measured: character-only digits left copy errors as the reward ceiling).
DIGIT_PAIRS: tuple[str, ...] = tuple(f"{value:02d}" for value in range(100))
ALL_TOKENS: tuple[str, ...] = SPECIAL_TOKENS + TAGS + CHARACTERS + DIGIT_PAIRS
VOCAB_SIZE = len(ALL_TOKENS)
PAD_TOKEN_ID, BOS_TOKEN_ID, EOS_TOKEN_ID, UNK_TOKEN_ID = range(4)


@dataclass(frozen=True, kw_only=True, slots=True)
class TinyModelConfig:
    """Shape of the tiny policy (defaults are the tuned demo values)."""

    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of decoder layers; copying tool results needs at least two (induction)."""
    num_heads: int = 4
    """Attention heads per layer (also the number of KV heads)."""
    intermediate_size: int = 256
    """Width of each MLP."""
    max_context_tokens: int = 256
    """Longest sequence the model supports (prompt plus all turns)."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads})"
            )


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer; tags are single added tokens.

    Unknown characters map to ``<unk>``; decoding fuses tokens without separators.
    """
    vocab = {token: index for index, token in enumerate(ALL_TOKENS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    # Split into digit pairs (greedy, left to right) and single characters, so that
    # WordLevel sees one vocabulary entry per "word".
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d\d|."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    # Tags are added but not special: decode keeps them even with skip_special_tokens.
    backend.add_tokens([AddedToken(tag, normalized=False, special=False) for tag in TAGS])
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", special_tokens=[(BOS_TOKEN, BOS_TOKEN_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=TinyModelConfig().max_context_tokens,
    )


def stop_token_ids(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """Token ids that end a turn: the closing action tags and ``<eos>``."""
    tags = ("</calc>", "</ans>")
    return [tokenizer.convert_tokens_to_ids(tag) for tag in tags] + [tokenizer.eos_token_id]


def build_model(cfg: TinyModelConfig, seed: int) -> LlamaForCausalLM:
    """Build a randomly initialised model; equal seeds give identical weights."""
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_context_tokens,
        rope_theta=cfg.rope_theta,
        pad_token_id=PAD_TOKEN_ID,
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        tie_word_embeddings=False,
    )
    # Fork the RNG so building a model does not shift the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model


def save_model_dir(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, path: str) -> None:
    """Write model config, safetensors weights and tokenizer files into ``path``."""
    Path(path).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def load_model_dir(path: str) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Load what :func:`save_model_dir` wrote, offline, in eval mode on CPU."""
    model = LlamaForCausalLM.from_pretrained(path, local_files_only=True)
    model.eval()
    return model, load_tokenizer(path)


def load_tokenizer(path: str) -> PreTrainedTokenizerFast:
    """Load the tokenizer saved by :func:`save_model_dir`."""
    return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)


def encode_segments(
    tokenizer: PreTrainedTokenizerFast, segments: list[Segment]
) -> tuple[list[int], list[int]]:
    """Tokenize a demonstration piece by piece, exactly as the agent loop does.

    Returns:
        ``(token_ids, loss_mask)`` with ``<bos>`` first; the mask is 1 on the tokens of
        trainable segments only.
    """
    token_ids: list[int] = []
    loss_mask: list[int] = []
    for index, segment in enumerate(segments):
        ids = tokenizer(segment.text, add_special_tokens=index == 0)["input_ids"]
        token_ids.extend(ids)
        loss_mask.extend([int(segment.is_trainable)] * len(ids))
    return token_ids, loss_mask
