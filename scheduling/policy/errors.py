"""Errors raised by the placement policies.

The policy core is pure (no grpc), so these do not derive from ``libra.errors``; the
scheduler servicer's interceptor maps them (``UnknownBucket``/``UnknownTrajectory`` ->
NOT_FOUND, ``DuplicateTrajectory`` -> ALREADY_EXISTS). Lookup errors subclass
``KeyError`` so ``except KeyError`` in a caller keeps working.
"""

from __future__ import annotations


class PolicyError(Exception):
    """Base class for every error a placement policy raises on purpose."""

    def __str__(self) -> str:
        # KeyError.__str__ would quote the message; keep it readable for all subclasses.
        return str(self.args[0]) if self.args else self.__class__.__name__


class UnknownBucket(PolicyError, KeyError):
    """A bucket name is not part of the layout."""

    def __init__(self, name: str, valid_names: tuple[str, ...]) -> None:
        super().__init__(f"unknown bucket {name!r}; layout has {list(valid_names)}")
        self.name = name


class UnknownTrajectory(PolicyError, KeyError):
    """A call names a trajectory the policy has no state for (never begun, or finished)."""

    def __init__(self, trajectory_id: str) -> None:
        super().__init__(f"unknown trajectory_id={trajectory_id!r}: not begun or already finished")
        self.trajectory_id = trajectory_id


class DuplicateTrajectory(PolicyError, ValueError):
    """``begin`` was called for a trajectory that is already placed."""

    def __init__(self, trajectory_id: str) -> None:
        super().__init__(
            f"trajectory_id={trajectory_id!r} is already placed; finish or abort it first"
        )
        self.trajectory_id = trajectory_id
