"""Write the example datasets shipped in deploy/data/ (deterministic: same bytes each run).

``deploy/data/calc-words.jsonl`` (training) and ``calc-words-eval.jsonl`` (held out) are
the built-in ``calc-words`` task as JSON Lines, read by
``deploy/configs/smollm2-calc-jsonl.toml`` (``[task] kind = "jsonl"``). Each row:

- ``question``: the word problem (the prompt);
- ``answer``: the integer answer as text (the reward's reference);
- ``metadata``: ``{"expression": ..., "source": "calc-words", "seed": ...}``;
- ``demonstration``: a warm-start conversation (user, assistant tool calls, tool results,
  final answer), the same mixture of habits the built-in warm start generates, with the
  example config's calculator failure rate and turn limit.

Usage: ``.venv/bin/python scripts/make_example_data.py [--out deploy/data]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from libra.tasks import calc_words_problems, chat_demonstration  # noqa: E402

# name -> (problem seed, rows); the eval set uses another seed, so it is held out.
FILES = {"calc-words.jsonl": (0, 384), "calc-words-eval.jsonl": (1, 64)}
# As in deploy/configs/smollm2-calc.toml: what the warm start's demonstrations assume.
FAILURE_RATE = 0.1
MAX_TURNS = 4
DEMO_SEED = 0


def build_rows(seed: int, num_rows: int) -> list[dict[str, Any]]:
    """The rows of one file (equal arguments give equal rows)."""
    rng = random.Random(DEMO_SEED * 1000 + seed)
    rows = []
    for problem in calc_words_problems(seed, num_rows):
        demo = chat_demonstration(problem, rng, failure_rate=FAILURE_RATE, max_turns=MAX_TURNS)
        rows.append({"question": problem.prompt, "answer": str(problem.answer),
                     "metadata": {"expression": problem.expression, "source": "calc-words",
                                  "seed": seed},
                     "demonstration": demo})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    """JSON Lines text (one compact object per line, keys sorted)."""
    return "".join(json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n"
                   for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "deploy" / "data")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (seed, num_rows) in FILES.items():
        path = args.out / name
        path.write_text(render(build_rows(seed, num_rows)))
        print(f"wrote {path} ({num_rows} rows, {path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
