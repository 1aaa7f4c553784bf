"""Typed identifiers: ``NewType`` names for the ids every process passes.

A ``JobId`` is a ``str`` at run time; the name tells a reader (and the type checker)
which id a parameter takes. ``libra.ids`` builds them; ``libra.types`` re-exports them.
"""

from __future__ import annotations

from typing import NewType

JobId = NewType("JobId", str)
TrajectoryId = NewType("TrajectoryId", str)
GroupId = NewType("GroupId", str)
PromptId = NewType("PromptId", str)
WorkerId = NewType("WorkerId", str)
InstanceId = NewType("InstanceId", str)
PolicyVersion = NewType("PolicyVersion", int)
