"""Global Resource Planner, pure core (no grpc, redis or torch; numpy-free).

``PlanSearch`` scores and searches plans with the analytic ``costmodel``;
``GlobalResourcePlanner`` adds triggers, the net-gain rule, calibration against
measured step times and the elastic hybrid-pool signal. The coordinator service and
the cluster simulator (``sim/``) both drive it; ``LivePlanner`` (``live``) feeds it a
running job's step records and leases. See ``docs/planner.md``.
"""

from scheduling.planner.calibration import CalibratorConfig, RatioCalibrator
from scheduling.planner.costmodel import (
    InstanceProfile,
    RequestStats,
    RolloutCostModel,
    TrainParallelism,
    instance_profile,
    kv_bytes_per_token,
    kv_capacity_tokens,
    prefill_s,
    step_s,
    train_memory_fits,
    train_step_s,
    weight_bytes_per_gpu,
    weights_read_per_gpu,
)
from scheduling.planner.live import LiveConfig, LivePlanner
from scheduling.planner.plan import (
    ClusterShape,
    NodePattern,
    Plan,
    PlanError,
    pipeline_depth,
)
from scheduling.planner.planner import (
    ElasticSignal,
    GlobalResourcePlanner,
    PlanEvent,
    PlannerConfig,
    StepMetrics,
)
from scheduling.planner.search import (
    PlanSearch,
    RolloutRefiner,
    Scored,
    SearchSpace,
    Workload,
)
from scheduling.planner.specs import HardwareSpec, ModelSpec

__all__ = [
    "CalibratorConfig",
    "ClusterShape",
    "ElasticSignal",
    "GlobalResourcePlanner",
    "HardwareSpec",
    "InstanceProfile",
    "LiveConfig",
    "LivePlanner",
    "ModelSpec",
    "NodePattern",
    "Plan",
    "PlanError",
    "PlanEvent",
    "PlanSearch",
    "PlannerConfig",
    "RatioCalibrator",
    "RequestStats",
    "RolloutRefiner",
    "RolloutCostModel",
    "Scored",
    "SearchSpace",
    "StepMetrics",
    "TrainParallelism",
    "Workload",
    "instance_profile",
    "kv_bytes_per_token",
    "kv_capacity_tokens",
    "pipeline_depth",
    "prefill_s",
    "step_s",
    "train_memory_fits",
    "train_step_s",
    "weight_bytes_per_gpu",
    "weights_read_per_gpu",
]
