"""The roofline's engine physics against the published measurements cited in
``sim/presets.py`` (issue 20 item 1). Each case names its source; tolerances are the
spread we accept between a roofline and one engine version's measurement."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.planner import ModelSpec, prefill_s, step_s
from scheduling.planner.roofline import tp_comm_s
from sim.presets import HARDWARE, UNCERTAIN, cluster, model, perturbed

GB, GIB = 1e9, 1024**3
A800 = HARDWARE["a800"]
# A100 SXM: same die as A800, NVLink 600 GB/s bidirectional (A800 400): the all-reduce
# bandwidth scales with the link, as in the presets.
A100_80 = replace(
    A800, name="A100-80G", allreduce_bus_bw_bytes_per_s=A800.allreduce_bus_bw_bytes_per_s * 1.5
)
A100_40 = replace(A100_80, name="A100-40G", hbm_bytes=40 * GIB, hbm_bw_bytes_per_s=1555 * GB)
LLAMA31_8B = ModelSpec(
    name="Llama-3.1-8B", num_params=8.03e9, num_active_params=8.03e9, num_layers=32,
    hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=128256,
)
LLAMA2_70B = ModelSpec(
    name="Llama-2-70B", num_params=69e9, num_active_params=69e9, num_layers=80,
    hidden_size=8192, num_heads=64, num_kv_heads=8, head_dim=128, vocab_size=32000,
)
LLAMA_33B = ModelSpec(
    name="LLaMA-33B", num_params=32.5e9, num_active_params=32.5e9, num_layers=60,
    hidden_size=6656, num_heads=52, num_kv_heads=52, head_dim=128, vocab_size=32000,
)


def _latency_benchmark_s(hw, mdl, tp: int, batch: int, input_len: int, output_len: int) -> float:
    """vLLM ``benchmark_latency.py``: prefill the batch, then ``output_len`` decode steps."""
    total = batch * prefill_s(hw, mdl, tp, input_len)
    for k in range(output_len):
        total += step_s(hw, mdl, tp, batch, batch * (input_len + k))
    return total


def test_single_request_decode_matches_a100_sweep() -> None:
    # johnmusgrave.com, "vLLM throughput-latency sweep on NVIDIA A100": Llama-3.1-8B,
    # A100 40GB, one request, 1,024 in / 128 out: 75 tok/s = 13.3 ms per token.
    predicted = step_s(A100_40, LLAMA31_8B, 1, 1, 1024 + 64)
    assert predicted == pytest.approx(13.3e-3, rel=0.10)


@pytest.mark.parametrize(
    ("mdl", "tp", "measured_s"),
    [(LLAMA2_70B, 4, 14.57), (LLAMA_33B, 2, 14.38)],
    ids=["llama2-70b-tp4", "llama-33b-tp2"],
)
def test_tp_latency_matches_vllm_custom_allreduce_pr(mdl, tp, measured_s) -> None:
    # vllm-project/vllm PR #2192 (custom all-reduce), A100-80G, benchmark_latency.py
    # --input-len 256 --output-len 256 --batch-size 64: 14.57 s (70B TP4), 14.38 s (33B TP2).
    predicted = _latency_benchmark_s(A100_80, mdl, tp, 64, 256, 256)
    assert predicted == pytest.approx(measured_s, rel=0.15)


@pytest.mark.parametrize(("size_bytes", "measured_us"), [(32768, 7.8), (1048576, 33.8)])
def test_allreduce_matches_sglang_h100_table(size_bytes: int, measured_us: float) -> None:
    # sgl-project/sglang PR #2904, H100, TP8 custom all-reduce: 32 KB 7.8 us, 1 MB 33.8 us.
    h100 = HARDWARE["h100"]
    tokens = size_bytes // (LLAMA31_8B.hidden_size * 2)
    per_allreduce = tp_comm_s(h100, LLAMA31_8B, 8, tokens) / (2 * LLAMA31_8B.num_layers)
    assert per_allreduce * 1e6 == pytest.approx(measured_us, rel=0.20)


def test_per_gpu_throughput_falls_with_tp() -> None:
    # Lambda (LambdaLabsML/vllm-benchmark) and r/LocalLLaMA "Qwen3 throughput benchmarks
    # on 2x 3090": where the model fits one device, data parallel beats tensor parallel.
    mdl = model("qwen3-14b")
    for batch in (1, 8, 32, 128):
        per_gpu = [batch / step_s(A800, mdl, tp, batch, batch * 4096) / tp for tp in (1, 2, 4, 8)]
        assert per_gpu == sorted(per_gpu, reverse=True)
        assert per_gpu[3] / per_gpu[0] < 0.65  # TP8 keeps well under the ideal 1.0


def test_perturbed_moves_one_constant_and_rejects_unknown_names() -> None:
    spec = cluster("a800x48")
    for name, u in UNCERTAIN.items():
        low = perturbed(spec, name, "low").hardware
        high = perturbed(spec, name, "high").hardware
        central = getattr(spec.hardware, u.field)
        assert getattr(low, u.field) == pytest.approx(central * u.low_scale)
        assert getattr(high, u.field) == pytest.approx(central * u.high_scale)
        assert perturbed(spec, name, "central") is spec
    with pytest.raises(ValueError, match="unknown constant 'nvlink'"):
        perturbed(spec, "nvlink", "low")
    with pytest.raises(ValueError, match="level must be"):
        perturbed(spec, "train_mfu", "extreme")
