"""Generators of the example datasets shipped in deploy/data/ (see scripts/make_example_data.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write JSON Lines (one compact object per line, keys sorted: same bytes each run)."""
    path.write_text("".join(json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n"
                            for row in rows))
    return path
