"""Hardware, model and cluster presets. Every constant names its source.

Hardware figures are vendor datasheet peaks (dense BF16, no sparsity); efficiencies
(HBM 0.85, prefill MFU 0.55) are the reference cost model's (design digest 5.2);
training MFU 0.40 is our assumption in the range Megatron-LM reports (Narayanan et al.,
SC'21: 44-52% of peak on A100 for large GPT models; long RL sequences and log-prob
recompute lower it). Model numbers are from each model's Hugging Face ``config.json``.

Engine physics (issue 20 item 1: TP scaling, per-step overhead, all-reduce latency,
prefill/decode interference) come from published measurements, each cited beside its
constant below; ``UNCERTAIN`` lists the low / high value of every constant we could not
pin down, for ``benchmarks/bench_sensitivity.py``. The calibration points the roofline
is checked against are in ``tests/unit/sim/test_physics_calibration.py``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scheduling.planner import HardwareSpec, ModelSpec

GB = 1e9
GIB = 1024**3

ENGINE_STEP_OVERHEAD_S = 1.2e-3
"""Per engine step, not hidden by the GPU. johnmusgrave.com, "vLLM throughput-latency
sweep on NVIDIA A100" (Llama-3.1-8B BF16, A100 40GB, one request): 75 tok/s = 13.3 ms
per token against a 10.3 ms weight-read roofline (16.06 GB / 1,555 GB/s); at the 0.85
HBM efficiency used here 12.1 ms, leaving ~1.2 ms per step. Low 0.4 ms (CUDA graphs,
async output processing), high 3 ms (vLLM blog 2024-09-05, "vLLM v0.6.0": before v0.6,
Llama-3-8B on one H100 spent 62% of the time outside the GPU: API server 33%, scheduling
29%)."""

ALLREDUCE_LATENCY_S = 8e-6
"""Fixed cost of one TP all-reduce inside an NVLink node. sgl-project/sglang PR #2904
(H100, TP 2/4/8, 512 B-32 KB messages): vLLM's custom all-reduce 8.5-11.8 us without
CUDA graphs, the TRT-LLM-derived kernel 3.7-7.8 us. Low 4 us, high 12 us."""

H100_ALLREDUCE_BUS_BW = 60 * GB
"""Bus bandwidth of a decode-sized all-reduce on H100 (NVLink 4). Same PR #2904 table:
from 32 KB to 1 MB the fast kernel's latency grows by 15.4 / 26.3 / 26.0 us at TP
2 / 4 / 8, i.e. ``2 (tp-1)/tp x 1 MB`` over 57-67 GB/s (vLLM's kernel: 48-56 GB/s), not
the 450 GB/s link peak. Low x0.5, high x2."""

NVLINK_BIDIR_GB_S = {"a800": 400, "h100": 900, "h200": 900}
"""Link peaks (datasheets) used to scale the H100 all-reduce figure to other parts
(no published decode-sized all-reduce measurement found for A800: DERIVED)."""


def _allreduce_bw(key: str) -> float:
    return H100_ALLREDUCE_BUS_BW * NVLINK_BIDIR_GB_S[key] / NVLINK_BIDIR_GB_S["h100"]


MIXED_BATCH_INTERFERENCE = 0.1
"""Agrawal et al., "SARATHI: Efficient LLM Inference by Piggybacking Decodes with
Chunked Prefills" (arXiv:2308.16369): decodes riding on a prefill chunk cost up to an
order of magnitude less per token than in a decode-only batch, so a mixed step costs
about ``max(mem, flops) + 0.1 x min(...)``. Low 0 (perfect overlap), high 0.3."""

_ENGINE = {
    "allreduce_latency_s": ALLREDUCE_LATENCY_S,
    "engine_step_overhead_s": ENGINE_STEP_OVERHEAD_S,
    "mixed_batch_interference": MIXED_BATCH_INTERFERENCE,
}

HARDWARE: dict[str, HardwareSpec] = {
    # NVIDIA A800 80GB SXM: same die and HBM2e as A100 80GB SXM (A100 datasheet:
    # 312 TFLOPS BF16 dense, 2,039 GB/s, 80 GB); NVLink capped at 400 GB/s bidirectional
    # (A800 product brief) -> 200 GB/s per direction. Network: 4x200 Gb/s HDR per node
    # shared by 8 GPUs (typical DGX-A100-class node) -> 12.5 GB/s per GPU.
    "a800": HardwareSpec(
        name="A800-80G",
        allreduce_bus_bw_bytes_per_s=_allreduce_bw("a800"),
        **_ENGINE,
        hbm_bytes=80 * GIB,
        hbm_bw_bytes_per_s=2039 * GB,
        peak_flops=312e12,
        intra_node_bw_bytes_per_s=200 * GB,
        inter_node_bw_bytes_per_s=12.5 * GB,
    ),
    # NVIDIA H100 SXM5 80GB datasheet: 989 TFLOPS BF16 dense, 3.35 TB/s HBM3, NVLink
    # 900 GB/s bidirectional (450 per direction); ConnectX-7 400 Gb/s per GPU = 50 GB/s.
    "h100": HardwareSpec(
        name="H100-80G",
        allreduce_bus_bw_bytes_per_s=_allreduce_bw("h100"),
        **_ENGINE,
        hbm_bytes=80 * GIB,
        hbm_bw_bytes_per_s=3350 * GB,
        peak_flops=989e12,
        intra_node_bw_bytes_per_s=450 * GB,
        inter_node_bw_bytes_per_s=50 * GB,
    ),
    # NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS BF16 dense, NVLink
    # 900 GB/s bidirectional; 400 Gb/s per GPU network.
    "h200": HardwareSpec(
        name="H200-141G",
        allreduce_bus_bw_bytes_per_s=_allreduce_bw("h200"),
        **_ENGINE,
        hbm_bytes=141 * GB,
        hbm_bw_bytes_per_s=4800 * GB,
        peak_flops=989e12,
        intra_node_bw_bytes_per_s=450 * GB,
        inter_node_bw_bytes_per_s=50 * GB,
    ),
    # Huawei Ascend 910B: 64 GB HBM2e; ~313 TFLOPS FP16/BF16 and ~1.6 TB/s as publicly
    # reported for the 910B (Huawei does not publish a full datasheet; LOWER CONFIDENCE).
    # HCCS 56 GB/s per link x 7 links in an 8-NPU board -> ~196 GB/s per NPU; RoCE
    # 200 Gb/s per NPU = 25 GB/s.
    "910b": HardwareSpec(
        name="Ascend-910B",
        hbm_bytes=64 * GIB,
        hbm_bw_bytes_per_s=1600 * GB,
        peak_flops=313e12,
        intra_node_bw_bytes_per_s=196 * GB,
        inter_node_bw_bytes_per_s=25 * GB,
        # HCCS link peak 196 GB/s per direction vs NVLink 4's 450: the H100 figure
        # scaled (DERIVED, lower confidence); Ascend's all-reduce latency ~20 us.
        allreduce_bus_bw_bytes_per_s=H100_ALLREDUCE_BUS_BW * 196 / 450,
        engine_step_overhead_s=ENGINE_STEP_OVERHEAD_S,
        mixed_batch_interference=MIXED_BATCH_INTERFERENCE,
        allreduce_latency_s=20e-6,
    ),
}
HARDWARE_ALIASES = {
    "a800-80g": "a800",
    "h100-80g": "h100",
    "h200-141g": "h200",
    "ascend": "910b",
    "ascend-910b": "910b",
    "910b3": "910b",
}

MODELS: dict[str, ModelSpec] = {
    # Qwen/Qwen3-4B config.json: 36 layers, hidden 2560, 32 heads, 8 KV heads, head_dim
    # 128, vocab 151,936; model card: 4.0B parameters (tied embeddings).
    "qwen3-4b": ModelSpec(
        name="Qwen3-4B",
        num_params=4.02e9,
        num_active_params=4.02e9,
        num_layers=36,
        hidden_size=2560,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
    # Qwen/Qwen3-14B config.json: 40 layers, hidden 5120, 40 heads, 8 KV heads, head_dim
    # 128, vocab 151,936; model card: 14.8B parameters.
    "qwen3-14b": ModelSpec(
        name="Qwen3-14B",
        num_params=14.8e9,
        num_active_params=14.8e9,
        num_layers=40,
        hidden_size=5120,
        num_heads=40,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
    # Qwen/Qwen3-30B-A3B config.json: 48 layers, hidden 2048, 32 heads, 4 KV heads,
    # head_dim 128, 128 experts, 8 active, moe_intermediate 768; model card: 30.5B total,
    # 3.3B active. Expert parameters: 48 layers x 128 x 3 x 2048 x 768 = 29.0B.
    "qwen3-30b-a3b": ModelSpec(
        name="Qwen3-30B-A3B",
        num_params=30.5e9,
        num_active_params=3.3e9,
        num_layers=48,
        hidden_size=2048,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        vocab_size=151936,
        num_experts=128,
        num_active_experts=8,
        expert_params=48 * 128 * 3 * 2048 * 768,
    ),
}

DEFAULT_MODEL = "qwen3-14b"
"""Model of a ``<hw>x<count>`` preset (the paper's 48-GPU arm runs Qwen3-14B)."""

WEIGHT_LOAD_BW_BYTES_PER_S = 2 * GB
"""Bandwidth at which a re-created rollout instance loads weights (our assumption: NVMe
or page-cache read into HBM, 2 GB/s per device); sets the planner's move cost."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A simulated cluster: devices, nodes, model."""

    name: str
    hardware: HardwareSpec
    model: ModelSpec
    num_nodes: int
    gpus_per_node: int

    @property
    def num_gpus(self) -> int:
        """All devices."""
        return self.num_nodes * self.gpus_per_node

    def to_dict(self) -> dict[str, Any]:
        """Short JSON form."""
        return {
            "name": self.name,
            "hardware": self.hardware.name,
            "model": self.model.name,
            "num_nodes": self.num_nodes,
            "gpus_per_node": self.gpus_per_node,
        }


def hardware(name: str) -> HardwareSpec:
    """Hardware preset by name (case-insensitive, aliases accepted)."""
    key = HARDWARE_ALIASES.get(name.lower(), name.lower())
    if key not in HARDWARE:
        raise ValueError(f"unknown hardware preset {name!r}; known: {', '.join(sorted(HARDWARE))}")
    return HARDWARE[key]


def model(name: str) -> ModelSpec:
    """Model preset by name (case-insensitive)."""
    key = name.lower()
    if key not in MODELS:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[key]


_PRESET = re.compile(r"^([a-z0-9\-]+)x(\d+)$")


def cluster(spec: str, model_name: str | None = None) -> ClusterSpec:
    """Cluster from a preset (``a800x48``, ``h100x1000``) or a JSON file.

    The file holds ``{"hardware": "a800", "num_nodes": 6, "gpus_per_node": 8, "model":
    "qwen3-14b"}``; ``hardware`` may instead be an object with ``HardwareSpec`` fields.
    Counts that are not a multiple of 8 round up to whole 8-device nodes.

    Raises:
        ValueError: Unknown preset or malformed file (the message names the field).
    """
    path = Path(spec)
    if path.suffix == ".json" or path.is_file():
        return _cluster_from_file(path, model_name)
    match = _PRESET.match(spec.lower())
    if match is None:
        raise ValueError(
            f"unknown cluster preset {spec!r}: use HW x COUNT such as a800x48 "
            f"(HW one of {', '.join(sorted(HARDWARE))}) or a JSON file"
        )
    hw = hardware(match.group(1))
    count = int(match.group(2))
    if count <= 0:
        raise ValueError(f"cluster preset {spec!r}: device count must be positive")
    nodes = -(-count // 8)
    mdl = model(model_name or DEFAULT_MODEL)
    return ClusterSpec(f"{match.group(1)}x{count}", hw, mdl, nodes, 8)


def _cluster_from_file(path: Path, model_name: str | None) -> ClusterSpec:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cluster file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"cluster file {path}: expected a JSON object")
    hw_field = data.get("hardware")
    if isinstance(hw_field, str):
        hw = hardware(hw_field)
    elif isinstance(hw_field, dict):
        base = hardware(hw_field.pop("base", "a800"))
        try:
            hw = replace(base, **hw_field)
        except TypeError as exc:
            raise ValueError(f"cluster file {path}: field 'hardware': {exc}") from None
    else:
        raise ValueError(
            f"cluster file {path}: field 'hardware' must be a preset name or an object"
        )
    for name in ("num_nodes", "gpus_per_node"):
        if not isinstance(data.get(name), int) or data[name] <= 0:
            raise ValueError(f"cluster file {path}: field {name!r} must be a positive integer")
    mdl = model(model_name or data.get("model", DEFAULT_MODEL))
    return ClusterSpec(
        data.get("name", path.stem), hw, mdl, data["num_nodes"], data["gpus_per_node"]
    )


@dataclass(frozen=True, slots=True)
class Uncertain:
    """An engine constant we could not pin down: its low and high value as multiples of
    the preset's central one (the source of each range is beside the constant)."""

    field: str
    low_scale: float
    high_scale: float


UNCERTAIN: dict[str, Uncertain] = {
    "engine_step_overhead": Uncertain("engine_step_overhead_s", 0.4 / 1.2, 3.0 / 1.2),
    "allreduce_latency": Uncertain("allreduce_latency_s", 0.5, 1.5),
    "allreduce_bus_bw": Uncertain("allreduce_bus_bw_bytes_per_s", 0.5, 2.0),
    "mixed_batch_interference": Uncertain("mixed_batch_interference", 0.0, 3.0),
    # Reference cost model's 0.85; measured 0.77 including per-step overhead
    # (johnmusgrave.com, above), 0.92 for a well-tuned kernel.
    "hbm_efficiency": Uncertain("hbm_efficiency", 0.75 / 0.85, 0.92 / 0.85),
    # Reference 0.55; 0.45-0.65 brackets prefill MFU of 8-70B models in vLLM/SGLang.
    "prefill_mfu": Uncertain("prefill_mfu", 0.45 / 0.55, 0.65 / 0.55),
    # Megatron-LM 44-52% on A100 (Narayanan et al.); RL recompute lowers it.
    "train_mfu": Uncertain("train_mfu", 0.30 / 0.40, 0.50 / 0.40),
}
"""Every uncertain constant, keyed by the name the sensitivity table prints."""


def perturbed(spec: ClusterSpec, name: str, level: str) -> ClusterSpec:
    """``spec`` with the uncertain constant ``name`` at ``level`` (low|central|high).

    Raises:
        ValueError: Unknown constant or level (the message lists the valid ones).
    """
    if name not in UNCERTAIN:
        raise ValueError(f"unknown constant {name!r}; known: {', '.join(UNCERTAIN)}")
    if level not in ("low", "central", "high"):
        raise ValueError(f"level must be low, central or high, got {level!r}")
    if level == "central":
        return spec
    u = UNCERTAIN[name]
    scale = u.low_scale if level == "low" else u.high_scale
    value = getattr(spec.hardware, u.field) * scale
    return replace(spec, hardware=replace(spec.hardware, **{u.field: value}))
