"""The ``receipts`` example: chat-message prompts, the python tool, a composite reward.

Each prompt is a short conversation (``messages``): the user lists a shop receipt, the
assistant acknowledges, the user asks for the total after a discount, in whole cents
(rounded down). The reference is that integer. The demonstration computes it with one
``python`` call and states it, so a reward can check both the number and the form.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from example_data import write_jsonl

_ITEMS = (("notebook", 425), ("pen", 150), ("stapler", 899), ("coffee", 1275),
          ("apple", 45), ("bread", 329), ("tape", 210), ("folder", 95), ("lamp", 2450),
          ("battery", 599), ("mug", 780), ("candle", 365))
_DISCOUNTS_PCT = (0, 5, 10, 15, 20, 25)


@dataclass(frozen=True)
class Receipt:
    lines: tuple[tuple[str, int, int], ...]
    """(item, quantity, unit price in cents)."""
    discount_pct: int

    @property
    def total_cents(self) -> int:
        gross = sum(qty * price for _, qty, price in self.lines)
        return gross * (100 - self.discount_pct) // 100

    def code(self) -> str:
        terms = " + ".join(f"{qty} * {price}" for _, qty, price in self.lines)
        return f"print(({terms}) * (100 - {self.discount_pct}) // 100)"

    def prompt(self) -> list[dict[str, str]]:
        listing = "\n".join(f"- {qty} x {item} at ${price / 100:.2f}"
                            for item, qty, price in self.lines)
        ask = (f"What did I pay in total after the {self.discount_pct}% discount, in "
               "cents, rounded down?" if self.discount_pct else
               "What did I pay in total, in cents?")
        return [{"role": "user", "content": f"Here is my receipt:\n{listing}"},
                {"role": "assistant", "content": "Got it. What would you like to know?"},
                {"role": "user", "content": ask}]


def make_receipts(seed: int, count: int) -> list[Receipt]:
    """``count`` receipts of 2-4 lines (equal arguments give equal receipts)."""
    rng = random.Random(seed)
    return [Receipt(tuple((item, rng.randint(1, 6), price)
                          for item, price in rng.sample(_ITEMS, rng.randint(2, 4))),
                    rng.choice(_DISCOUNTS_PCT)) for _ in range(count)]


def demonstration(receipt: Receipt) -> list[dict[str, Any]]:
    """The prompt, one python call with its output, the answer sentence."""
    total = receipt.total_cents
    return [*receipt.prompt(),
            {"role": "assistant", "content": "",
             "tool_calls": [{"name": "python", "arguments": {"code": receipt.code()}}]},
            {"role": "tool", "name": "python", "content": f"{total}\n"},
            {"role": "assistant", "content": f"You paid {total} cents."}]


def rows(receipts: list[Receipt], seed: int) -> list[dict[str, Any]]:
    """Dataset rows: messages, answer, metadata and the demonstration."""
    return [{"messages": r.prompt(), "answer": str(r.total_cents),
             "metadata": {"discount_pct": r.discount_pct, "num_lines": len(r.lines),
                          "source": "receipts", "seed": seed},
             "demonstration": demonstration(r)} for r in receipts]


def write(out: Path, *, num_train: int = 256, num_eval: int = 48) -> list[Path]:
    """Write the training and the held-out rows (other seeds); returns the paths."""
    return [write_jsonl(out / "receipts.jsonl", rows(make_receipts(0, num_train), 0)),
            write_jsonl(out / "receipts-eval.jsonl", rows(make_receipts(1, num_eval), 1))]
