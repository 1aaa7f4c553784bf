"""Write the example datasets shipped in deploy/data/ (deterministic: same bytes each run).

- ``calc-words.jsonl`` (training) and ``calc-words-eval.jsonl`` (held out): the built-in
  ``calc-words`` task as JSON Lines, read by ``deploy/configs/smollm2-calc-jsonl.toml``.
  Each row: ``question`` (the word problem), ``answer`` (the integer answer as text),
  ``metadata`` (``{"expression", "source", "seed"}``) and ``demonstration`` (a warm-start
  conversation with the same mixture of habits the built-in warm start generates, with
  the example config's calculator failure rate and turn limit).
- ``almanac-corpus.txt``, ``almanac.jsonl``, ``almanac-eval.jsonl``: questions that need
  the search and python tools (scripts/example_data/almanac.py;
  ``deploy/configs/almanac-tools.toml``).
- ``receipts.jsonl``, ``receipts-eval.jsonl``: chat-message prompts for the python tool
  and a composite reward (scripts/example_data/receipts.py;
  ``deploy/configs/receipts-composite.toml``).

Usage: ``.venv/bin/python scripts/make_example_data.py [--out deploy/data]``.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "scripts"):  # the project, and the example_data generators
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from example_data import almanac, receipts, write_jsonl  # noqa: E402

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


def write_all(out: Path) -> list[Path]:
    """Write every example dataset into ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [write_jsonl(out / name, build_rows(seed, num_rows))
             for name, (seed, num_rows) in FILES.items()]
    return [*paths, *almanac.write(out), *receipts.write(out)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "deploy" / "data")
    args = parser.parse_args(argv)
    for path in write_all(args.out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
