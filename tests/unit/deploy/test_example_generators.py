"""The almanac and receipts example datasets are right: every answer follows from the
corpus or the receipt, every demonstration's tool calls return what the demonstration
says, and the held-out rows are not training rows."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "deploy" / "data"


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def _run_print(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # the demonstrations' programs are one print of integer arithmetic
    return out.getvalue()


def _facts() -> dict[str, tuple[int, int, int]]:
    pattern = re.compile(r"(\w+) was founded in (\d+) and has (\d+) inhabitants\. The "
                         r"harbour of \w+ handles (\d+) ships")
    text = (DATA / "almanac-corpus.txt").read_text()
    return {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in pattern.finditer(text)}


def test_almanac_answers_follow_from_the_corpus() -> None:
    facts = _facts()
    assert len(facts) == 96
    for row in _rows("almanac.jsonl") + _rows("almanac-eval.jsonl"):
        a, b = (facts[name] for name in row["metadata"]["towns"])
        question, answer = row["question"], int(row["answer"])
        if "years before" in question:
            assert answer == abs(a[0] - b[0])
        elif "inhabitants" in question:
            assert answer == a[1] + b[1]
        else:
            assert answer == a[2] - b[2]


def test_almanac_demonstrations_search_both_towns_then_compute() -> None:
    for row in _rows("almanac.jsonl")[:64]:
        demo = row["demonstration"]
        calls = [m["tool_calls"][0] for m in demo if m.get("tool_calls")]
        assert [c["name"] for c in calls] == ["search", "search", "python"]
        towns = row["metadata"]["towns"]
        assert [c["arguments"]["query"] for c in calls[:2]] == towns
        results = [m["content"] for m in demo if m["role"] == "tool"]
        for town, result in zip(towns, results[:2], strict=True):
            assert f"{town} was founded" in result
        assert _run_print(calls[2]["arguments"]["code"]) == results[2] == f"{row['answer']}\n"
        assert demo[-1]["content"].endswith(f"{row['answer']}.")


def test_receipts_demonstrations_compute_the_reference() -> None:
    for row in _rows("receipts.jsonl")[:64] + _rows("receipts-eval.jsonl"):
        demo = row["demonstration"]
        assert demo[:3] == row["messages"] and row["messages"][-1]["role"] == "user"
        code = demo[3]["tool_calls"][0]["arguments"]["code"]
        assert _run_print(code) == demo[4]["content"] == f"{row['answer']}\n"


def test_held_out_rows_are_not_training_rows() -> None:
    for train, held_out, key in (("almanac.jsonl", "almanac-eval.jsonl", "question"),
                                 ("receipts.jsonl", "receipts-eval.jsonl", "messages")):
        seen = {json.dumps(row[key]) for row in _rows(train)}
        assert not any(json.dumps(row[key]) in seen for row in _rows(held_out)), train
