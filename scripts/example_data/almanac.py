"""The ``almanac`` example: questions that need two tools, search and python.

A made-up almanac of towns (so no model knows the answers from pre-training) is the
search corpus, one paragraph per town: founding year, inhabitants, ships through its
harbour a year. Each question combines two facts, so the agent must look up both towns
(``search``) and compute the answer (``python``); the reference is an integer.

The warm-start demonstrations are made with the gateway's own ``SearchTool`` over the
written corpus, so the tool messages in them are exactly what the tool returns.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from example_data import write_jsonl

_ONSETS = ("b", "br", "d", "f", "g", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st",
           "t", "th", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "au", "ei", "oa")
_ENDINGS = ("holm", "wick", "stead", "mere", "ford", "by", "haven", "dale", "mouth", "gate")
_REGIONS = ("Osk valley", "northern fells", "salt coast", "Ebrin plain", "lake country",
            "eastern marches")
SEARCH_TOP_K = 2


@dataclass(frozen=True)
class Town:
    name: str
    region: str
    founded: int
    inhabitants: int
    ships_per_year: int

    def paragraph(self) -> str:
        return (f"{self.name} is a town in the {self.region}. {self.name} was founded in "
                f"{self.founded} and has {self.inhabitants} inhabitants. The harbour of "
                f"{self.name} handles {self.ships_per_year} ships a year.")


@dataclass(frozen=True)
class Question:
    text: str
    towns: tuple[Town, Town]
    code: str
    answer: int


def make_towns(seed: int, count: int) -> list[Town]:
    """``count`` towns with distinct names (equal arguments give equal towns)."""
    rng = random.Random(seed)
    names: set[str] = set()
    towns = []
    while len(towns) < count:
        stem = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 2)))
        name = (stem + rng.choice(_ENDINGS)).capitalize()
        if name in names:
            continue
        names.add(name)
        towns.append(Town(name, rng.choice(_REGIONS), rng.randint(1100, 1950),
                          rng.randint(800, 90000), rng.randint(12, 900)))
    return towns


def _question(a: Town, b: Town, kind: int) -> Question:
    if kind == 0:
        older, newer = (a, b) if a.founded <= b.founded else (b, a)
        return Question(f"How many years before {newer.name} was {older.name} founded?",
                        (a, b), f"print({newer.founded} - {older.founded})",
                        newer.founded - older.founded)
    if kind == 1:
        return Question(f"How many inhabitants do {a.name} and {b.name} have together?",
                        (a, b), f"print({a.inhabitants} + {b.inhabitants})",
                        a.inhabitants + b.inhabitants)
    return Question(f"How many more ships a year does the harbour of {a.name} handle than "
                    f"the harbour of {b.name}? (Negative if fewer.)", (a, b),
                    f"print({a.ships_per_year} - {b.ships_per_year})",
                    a.ships_per_year - b.ships_per_year)


def make_questions(towns: list[Town], seed: int, count: int) -> list[Question]:
    """``count`` questions over distinct pairs of ``towns``."""
    rng = random.Random(seed)
    seen: set[tuple[str, str, int]] = set()
    questions = []
    while len(questions) < count:
        a, b = rng.sample(towns, 2)
        kind = rng.randrange(3)
        if (a.name, b.name, kind) in seen:
            continue
        seen.add((a.name, b.name, kind))
        questions.append(_question(a, b, kind))
    return questions


def corpus_text(towns: list[Town]) -> str:
    """The search corpus: one paragraph per town, blank-line separated."""
    return "\n\n".join(town.paragraph() for town in towns) + "\n"


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"name": name, "arguments": arguments}]}


def demonstration(question: Question, search: Any, corpus: tuple[str, ...]) -> list[dict]:
    """User, two searches with their real results, the python call, the answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question.text}]
    for town in question.towns:
        hits = search.search(town.name, SEARCH_TOP_K, corpus)
        messages.append(_call("search", {"query": town.name, "top_k": SEARCH_TOP_K}))
        messages.append({"role": "tool", "name": "search", "content": "\n".join(
            f"[{n}] {text}" for n, (_, text) in enumerate(hits, 1))})
    messages.append(_call("python", {"code": question.code}))
    messages.append({"role": "tool", "name": "python", "content": f"{question.answer}\n"})
    messages.append({"role": "assistant", "content": f"The answer is {question.answer}."})
    return messages


def rows(questions: list[Question], search: Any, corpus: tuple[str, ...],
         seed: int) -> list[dict[str, Any]]:
    """Dataset rows: question, answer, metadata (the towns) and the demonstration."""
    return [{"question": q.text, "answer": str(q.answer),
             "metadata": {"towns": [t.name for t in q.towns], "source": "almanac",
                          "seed": seed},
             "demonstration": demonstration(q, search, corpus)} for q in questions]


def write(out: Path, *, num_towns: int = 96, num_train: int = 256,
          num_eval: int = 48) -> list[Path]:
    """Write the corpus, the training and the held-out rows; returns the paths."""
    from services.toolgateway.tools.search import SearchConfig, SearchTool

    towns = make_towns(0, num_towns)
    corpus = out / "almanac-corpus.txt"
    corpus.write_text(corpus_text(towns))
    search = SearchTool(SearchConfig(corpus_paths=(str(corpus),)))
    questions = make_questions(towns, 0, num_train + num_eval)
    train, held_out = questions[:num_train], questions[num_train:]
    paths = [corpus,
             write_jsonl(out / "almanac.jsonl", rows(train, search, (), 0)),
             write_jsonl(out / "almanac-eval.jsonl", rows(held_out, search, (), 1))]
    return paths
