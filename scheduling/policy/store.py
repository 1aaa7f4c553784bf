"""Where a placement policy keeps its mutable state.

The policy core never holds per-trajectory state itself: it goes through a
``PolicyStore`` so that several scheduler replicas can share it (a Redis store in the
service) and the simulator can use ``InMemoryPolicyStore``. Values are plain JSON-able
dicts keyed by strings, so a Redis implementation is one hash or string per key.

What lives where (suggested Redis mapping in brackets):

- per-trajectory state, ``TrajectoryRecord.to_dict()`` [hash or JSON string per id];
- small policy records by namespace, e.g. LA-MLFQ's history table and scouts [one hash
  per namespace];
- the recent-trajectory ring, the prefix tree's rebuild source [a capped list: RPUSH +
  LTRIM];
- the prefix-tree snapshot [one JSON string].
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class TrajectoryRecord:
    """Scheduler-side state of one placed trajectory.

    Attributes:
        trajectory_id: The trajectory.
        prompt_id: Its prompt (prefix-tree root).
        group_id: Its GRPO group ("" when not grouped).
        input_tokens: Prompt length.
        bucket: Bucket of the instance it is pinned to.
        instance_id: Instance it is pinned to (holds one unit of that instance's load).
        path_keys: Tool-return keys seen so far.
        positions_tokens: Post-prompt token position of each tool return.
        num_moves: How many times it was re-pinned.
    """

    trajectory_id: str
    prompt_id: str
    group_id: str
    input_tokens: int
    bucket: str
    instance_id: str
    path_keys: list[str] = field(default_factory=list)
    positions_tokens: list[int] = field(default_factory=list)
    num_moves: int = 0

    @property
    def num_tool_calls(self) -> int:
        """Completed tool calls so far."""
        return len(self.path_keys)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the store."""
        return {
            "trajectory_id": self.trajectory_id,
            "prompt_id": self.prompt_id,
            "group_id": self.group_id,
            "input_tokens": self.input_tokens,
            "bucket": self.bucket,
            "instance_id": self.instance_id,
            "path_keys": list(self.path_keys),
            "positions_tokens": list(self.positions_tokens),
            "num_moves": self.num_moves,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrajectoryRecord:
        """Inverse of ``to_dict``."""
        return cls(
            trajectory_id=data["trajectory_id"],
            prompt_id=data["prompt_id"],
            group_id=data["group_id"],
            input_tokens=int(data["input_tokens"]),
            bucket=data["bucket"],
            instance_id=data["instance_id"],
            path_keys=list(data["path_keys"]),
            positions_tokens=list(data["positions_tokens"]),
            num_moves=int(data["num_moves"]),
        )


class PolicyStore(Protocol):
    """Mutable state of a placement policy. All values are JSON-able dicts."""

    def get_trajectory(self, trajectory_id: str) -> dict[str, Any] | None:
        """Return the state of a placed trajectory, or ``None``."""
        ...

    def put_trajectory(self, trajectory_id: str, state: dict[str, Any]) -> None:
        """Create or replace the state of a trajectory."""
        ...

    def delete_trajectory(self, trajectory_id: str) -> None:
        """Drop a trajectory's state (no error if absent)."""
        ...

    def get_record(self, namespace: str, key: str) -> dict[str, Any] | None:
        """Return one policy record, or ``None``."""
        ...

    def put_record(self, namespace: str, key: str, value: dict[str, Any]) -> None:
        """Create or replace one policy record."""
        ...

    def delete_record(self, namespace: str, key: str) -> None:
        """Drop one policy record (no error if absent)."""
        ...

    def list_records(self, namespace: str) -> dict[str, dict[str, Any]]:
        """Return every record of a namespace (used for periodic pruning only)."""
        ...

    def append_recent(self, record: dict[str, Any], max_len: int) -> None:
        """Append to the recent-trajectory ring, keeping the newest ``max_len``."""
        ...

    def recent(self) -> list[dict[str, Any]]:
        """Return the recent-trajectory ring, oldest first."""
        ...

    def load_tree(self) -> dict[str, Any] | None:
        """Return the last saved prefix-tree snapshot, or ``None``."""
        ...

    def save_tree(self, snapshot: dict[str, Any]) -> None:
        """Replace the prefix-tree snapshot."""
        ...


class InMemoryPolicyStore:
    """``PolicyStore`` in process memory (simulator, tests, single-process runs).

    Args:
        copy_values: Round-trip every value through JSON on write and read. Slower;
            tests turn it on to prove state is serialisable and never shared by alias,
            as it would not be with Redis.
    """

    def __init__(self, copy_values: bool = False) -> None:
        self._copy_values = copy_values
        self._trajectories: dict[str, dict[str, Any]] = {}
        self._records: dict[str, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
        self._recent: collections.deque[dict[str, Any]] = collections.deque()
        self._tree: dict[str, Any] | None = None

    def _copy(self, value: Any) -> Any:
        return json.loads(json.dumps(value)) if self._copy_values and value is not None else value

    def get_trajectory(self, trajectory_id: str) -> dict[str, Any] | None:
        """The trajectory's state, or None once deleted (a copy with ``copy_values``)."""
        return self._copy(self._trajectories.get(trajectory_id))

    def put_trajectory(self, trajectory_id: str, state: dict[str, Any]) -> None:
        """Replace the trajectory's state (Redis: one hash or JSON string per id)."""
        self._trajectories[trajectory_id] = self._copy(state)

    def delete_trajectory(self, trajectory_id: str) -> None:
        """Drop the trajectory's state when it finishes; absent is no error."""
        self._trajectories.pop(trajectory_id, None)

    def get_record(self, namespace: str, key: str) -> dict[str, Any] | None:
        """One record of a policy namespace (e.g. LA-MLFQ's history), or None."""
        return self._copy(self._records[namespace].get(key))

    def put_record(self, namespace: str, key: str, value: dict[str, Any]) -> None:
        """Replace one record of a policy namespace."""
        self._records[namespace][key] = self._copy(value)

    def delete_record(self, namespace: str, key: str) -> None:
        """Drop one record of a policy namespace; absent is no error."""
        self._records[namespace].pop(key, None)

    def list_records(self, namespace: str) -> dict[str, dict[str, Any]]:
        """Every record of a namespace, by key (Redis: one HGETALL)."""
        return self._copy(dict(self._records[namespace]))

    def append_recent(self, record: dict[str, Any], max_len: int) -> None:
        """Add a finished trajectory to the ring the prefix tree is rebuilt from, keeping
        the newest ``max_len``."""
        self._recent.append(self._copy(record))
        while len(self._recent) > max_len:
            self._recent.popleft()

    def recent(self) -> list[dict[str, Any]]:
        """The ring, oldest first."""
        return self._copy(list(self._recent))

    def load_tree(self) -> dict[str, Any] | None:
        """The saved prefix-tree snapshot, or None before the first save."""
        return self._copy(self._tree)

    def save_tree(self, snapshot: dict[str, Any]) -> None:
        """Replace the prefix-tree snapshot."""
        self._tree = self._copy(snapshot)

    @property
    def num_trajectories(self) -> int:
        """Number of trajectories with state (for tests and reporting)."""
        return len(self._trajectories)
