"""Placement policies of the scheduler: C-MLFQ and the baselines, as a pure core.

No grpc, redis or torch: the scheduler service wraps these with a Redis-backed
``PolicyStore`` and the cluster simulator uses ``InMemoryPolicyStore``. See ``base``
for the call flow and how load accounting works.
"""

from services.scheduler.policy.base import (
    Action,
    Decision,
    InstanceSource,
    Placement,
    PlacementPolicy,
    Reason,
    Release,
    TrajectoryDescriptor,
)
from services.scheduler.policy.cmlfq import CmlfqConfig, CmlfqPolicy
from services.scheduler.policy.errors import (
    DuplicateTrajectory,
    PolicyError,
    UnknownBucket,
    UnknownTrajectory,
)
from services.scheduler.policy.la_mlfq import LaMlfqConfig, LaMlfqPolicy
from services.scheduler.policy.layout import BucketLayout
from services.scheduler.policy.least_loaded import LeastLoadedConfig, LeastLoadedPolicy
from services.scheduler.policy.length_aware import LengthAwareConfig, LengthAwarePolicy
from services.scheduler.policy.prefix_tree import (
    CausalPrefixTree,
    PrefixTreeNode,
    RecentTrajectory,
    TreeStats,
)
from services.scheduler.policy.registry import POLICY_NAMES, PolicyConfig, make_policy
from services.scheduler.policy.routing import (
    RoundRobinCursor,
    RouteKind,
    RouteResult,
    route,
    route_any,
)
from services.scheduler.policy.store import InMemoryPolicyStore, PolicyStore, TrajectoryRecord
from services.scheduler.policy.toolcount import ToolcountConfig, ToolcountPolicy

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
