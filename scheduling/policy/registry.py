"""``make_policy``: build a placement policy by name.

The scheduler service and the simulator select the policy from config with one call;
names match the reference schedulers (``least_loaded`` is the reference
``load_balance``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libra.clock import Clock
from scheduling.policy.base import PlacementPolicy
from scheduling.policy.cmlfq import CmlfqConfig, CmlfqPolicy
from scheduling.policy.la_mlfq import LaMlfqConfig, LaMlfqPolicy
from scheduling.policy.layout import BucketLayout
from scheduling.policy.least_loaded import LeastLoadedConfig, LeastLoadedPolicy
from scheduling.policy.length_aware import LengthAwareConfig, LengthAwarePolicy
from scheduling.policy.store import InMemoryPolicyStore, PolicyStore
from scheduling.policy.toolcount import ToolcountConfig, ToolcountPolicy

PolicyConfig = CmlfqConfig | LeastLoadedConfig | LengthAwareConfig | LaMlfqConfig | ToolcountConfig

_Builder = Callable[[BucketLayout, PolicyStore, Any, Clock | None], PlacementPolicy]


def _build_cmlfq(
    layout: BucketLayout, store: PolicyStore, config: Any, clock: Clock | None
) -> PlacementPolicy:
    policy = CmlfqPolicy(layout, store, config)
    # Picks up the tree a previous process or another replica left in the store.
    policy.restore()
    return policy


_REGISTRY: dict[str, tuple[type, _Builder]] = {
    "cmlfq": (CmlfqConfig, _build_cmlfq),
    "least_loaded": (
        LeastLoadedConfig,
        lambda layout, store, config, clock: LeastLoadedPolicy(layout, store, config),
    ),
    "length_aware": (
        LengthAwareConfig,
        lambda layout, store, config, clock: LengthAwarePolicy(layout, store, config),
    ),
    "la_mlfq": (
        LaMlfqConfig,
        lambda layout, store, config, clock: LaMlfqPolicy(layout, store, config, clock),
    ),
    "toolcount": (
        ToolcountConfig,
        lambda layout, store, config, clock: ToolcountPolicy(layout, store, config),
    ),
}

POLICY_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def make_policy(
    name: str,
    layout: BucketLayout,
    config: PolicyConfig | None = None,
    store: PolicyStore | None = None,
    clock: Clock | None = None,
) -> PlacementPolicy:
    """Build the policy called ``name``.

    Args:
        name: One of ``POLICY_NAMES``.
        layout: Bucket layout.
        config: The policy's config dataclass; ``None`` for its defaults.
        store: Policy state; a fresh ``InMemoryPolicyStore`` if omitted. For C-MLFQ the
            tree is restored from it (snapshot, else recent ring).
        clock: Time source (only ``la_mlfq`` reads time); system clock if omitted.

    Raises:
        ValueError: If ``name`` is unknown (the message lists the valid names).
        TypeError: If ``config`` is not the policy's config class.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown policy {name!r}; valid names: {', '.join(POLICY_NAMES)}")
    config_class, builder = _REGISTRY[name]
    if config is None:
        config = config_class()
    if not isinstance(config, config_class):
        raise TypeError(
            f"policy {name!r} takes a {config_class.__name__}, got {type(config).__name__}"
        )
    return builder(layout, store if store is not None else InMemoryPolicyStore(), config, clock)
