"""Placement policies of the scheduler: C-MLFQ and the baselines, as a pure core.

No grpc, redis or torch: the scheduler service wraps these with a Redis-backed
``PolicyStore`` and the cluster simulator uses ``InMemoryPolicyStore``. See ``base``
for the call flow and how load accounting works.
"""

from scheduling.policy.base import (
    Action,
    Decision,
    InstanceSource,
    Placement,
    PlacementPolicy,
    Reason,
    Release,
    TrajectoryDescriptor,
)
from scheduling.policy.cmlfq import CmlfqConfig, CmlfqPolicy
from scheduling.policy.errors import (
    DuplicateTrajectory,
    PolicyError,
    UnknownBucket,
    UnknownTrajectory,
)
from scheduling.policy.la_mlfq import LaMlfqConfig, LaMlfqPolicy
from scheduling.policy.layout import BucketLayout
from scheduling.policy.least_loaded import LeastLoadedConfig, LeastLoadedPolicy
from scheduling.policy.length_aware import LengthAwareConfig, LengthAwarePolicy
from scheduling.policy.prefix_tree import (
    CausalPrefixTree,
    PrefixTreeNode,
    RecentTrajectory,
    TreeStats,
)
from scheduling.policy.registry import POLICY_NAMES, PolicyConfig, make_policy
from scheduling.policy.routing import (
    RoundRobinCursor,
    RouteKind,
    RouteResult,
    route,
    route_any,
)
from scheduling.policy.store import InMemoryPolicyStore, PolicyStore, TrajectoryRecord
from scheduling.policy.toolcount import ToolcountConfig, ToolcountPolicy

__all__ = [
    "Action",
    "BucketLayout",
    "CausalPrefixTree",
    "CmlfqConfig",
    "CmlfqPolicy",
    "Decision",
    "DuplicateTrajectory",
    "InMemoryPolicyStore",
    "InstanceSource",
    "LaMlfqConfig",
    "LaMlfqPolicy",
    "LeastLoadedConfig",
    "LeastLoadedPolicy",
    "LengthAwareConfig",
    "LengthAwarePolicy",
    "POLICY_NAMES",
    "Placement",
    "PlacementPolicy",
    "PolicyConfig",
    "PolicyError",
    "PolicyStore",
    "PrefixTreeNode",
    "Reason",
    "RecentTrajectory",
    "Release",
    "RoundRobinCursor",
    "RouteKind",
    "RouteResult",
    "ToolcountConfig",
    "ToolcountPolicy",
    "TrajectoryDescriptor",
    "TrajectoryRecord",
    "TreeStats",
    "UnknownBucket",
    "UnknownTrajectory",
    "make_policy",
    "route",
    "route_any",
]
