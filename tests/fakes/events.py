"""Fake event sink: the ``record_event(kind, **fields)`` callables cores are given.

Replaces: the job's Redis event stream. Records each event in order.
"""

from __future__ import annotations

from typing import Any


class EventRecorder:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, kind: str, **fields: Any) -> None:
        self.items.append((kind, fields))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.items]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [fields for k, fields in self.items if k == kind]
