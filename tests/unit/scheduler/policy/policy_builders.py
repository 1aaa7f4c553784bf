"""Builders for the placement-policy unit tests (data, not fixtures).

Nothing is faked: policies run with ``InMemoryPolicyStore(copy_values=True)`` so every
stored value goes through JSON, as it would through Redis.
"""

from __future__ import annotations

from libra.types import (
    Bucket,
    GroupId,
    InstanceId,
    InstanceLoad,
    PromptId,
    SizeClass,
    ToolReturnState,
    ToolStatus,
    TrajectoryId,
)
from scheduling.policy import (
    BucketLayout,
    CmlfqConfig,
    CmlfqPolicy,
    InMemoryPolicyStore,
    TrajectoryDescriptor,
)

SHORT_MAX_TOKENS = 1_000
MEDIUM_MAX_TOKENS = 5_000
LONG_MAX_TOKENS = 20_000

FAIL = ToolReturnState("search", SizeClass.LARGE, ToolStatus.FAILURE)
OK = ToolReturnState("search", SizeClass.SMALL, ToolStatus.SUCCESS)
TIMEOUT = ToolReturnState("code", SizeClass.SMALL, ToolStatus.TIMEOUT)


def make_layout(cap: int = 2) -> BucketLayout:
    """Three buckets short/medium/long with the same per-instance cap."""
    return BucketLayout(
        [
            Bucket("short", SHORT_MAX_TOKENS, tp_degree=1, max_trajectories_per_instance=cap),
            Bucket("medium", MEDIUM_MAX_TOKENS, tp_degree=2, max_trajectories_per_instance=cap),
            Bucket("long", LONG_MAX_TOKENS, tp_degree=4, max_trajectories_per_instance=cap),
        ]
    )


def inst(instance_id: str, bucket: str, load: int = 0, is_live: bool = True) -> InstanceLoad:
    """One instance load entry."""
    return InstanceLoad(InstanceId(instance_id), bucket, load, is_live)


def one_per_bucket(short: int = 0, medium: int = 0, long: int = 0) -> list[InstanceLoad]:
    """Instances s0, m0, l0 with the given loads."""
    return [inst("s0", "short", short), inst("m0", "medium", medium), inst("l0", "long", long)]


def make_traj(
    trajectory_id: str = "t1",
    prompt_id: str = "p1",
    group_id: str | None = None,
    input_tokens: int = 100,
) -> TrajectoryDescriptor:
    """A trajectory descriptor."""
    return TrajectoryDescriptor(
        TrajectoryId(trajectory_id),
        PromptId(prompt_id),
        GroupId(group_id) if group_id is not None else None,
        input_tokens,
    )


REFERENCE_RULES: dict[str, object] = {
    "entry": "shortest",
    "disagree_rule": "stay",
    "live_thresholds": False,
    "min_node_visits": 1,
    "max_queue_length": 0,
}
"""The reference's C-MLFQ rules: the mechanics tests (moves, fallback, learning, restore)
run under them; ``test_policy_cmlfq_rules`` tests Libra's rules (the defaults)."""


def make_cmlfq(
    layout: BucketLayout | None = None, *, libra_rules: bool = False, **config: object
) -> tuple[CmlfqPolicy, InMemoryPolicyStore]:
    """A C-MLFQ policy over a JSON-copying in-memory store (reference rules unless
    ``libra_rules``; ``config`` overrides either)."""
    store = InMemoryPolicyStore(copy_values=True)
    knobs = config if libra_rules else {**REFERENCE_RULES, **config}
    policy = CmlfqPolicy(layout or make_layout(cap=100), store, CmlfqConfig(**knobs))  # type: ignore[arg-type]
    return policy, store


def run_trajectory(
    policy: object,
    trajectory_id: str,
    prompt_id: str,
    steps: list[tuple[ToolReturnState, int]],
    total_tokens: int,
    instances: list[InstanceLoad] | None = None,
) -> None:
    """Drive begin -> tool returns -> finish with plenty of capacity."""
    instances = instances or one_per_bucket()
    placement = policy.begin(make_traj(trajectory_id, prompt_id), instances)  # type: ignore[attr-defined]
    assert placement.is_placed
    for state, position_tokens in steps:
        policy.on_tool_return(TrajectoryId(trajectory_id), state, position_tokens, instances)  # type: ignore[attr-defined]
    policy.finish(TrajectoryId(trajectory_id), total_tokens)  # type: ignore[attr-defined]


def teach(
    policy: CmlfqPolicy,
    prompt_id: str,
    state: ToolReturnState,
    remaining_tokens: int,
    times: int = 3,
) -> None:
    """Finish ``times`` trajectories of ``prompt_id``, fixed remaining length after ``state``."""
    for i in range(times):
        run_trajectory(
            policy,
            f"teach-{prompt_id}-{state.key}-{remaining_tokens}-{i}",
            prompt_id,
            [(state, 10)],
            10 + remaining_tokens,
        )
