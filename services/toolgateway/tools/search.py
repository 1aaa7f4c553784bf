"""``search`` tool: BM25 (the ``bm25s`` library) over a local corpus.

Corpus files are plain text; each non-empty paragraph (blank-line separated) is one
document. The index is built once at construction (an adapter, so I/O there is fine).
The gateway's own corpus (its config) is read by the gateway; a job's corpus is opened
as an unprivileged identity (services/toolgateway/file_access.py), never as root.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libra.data_roots import DEFAULT_DATA_ROOTS, describe_roots, inside_roots, resolve_roots
from services.toolgateway.file_access import FileReaderConfig, JobFileReader
from services.toolgateway.tools.base import ToolContext, ToolOutput

SAMPLE_CORPUS = Path(__file__).resolve().parent.parent / "data" / "sample_corpus.txt"


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchConfig:
    """Corpus and result shape of the search tool."""

    corpus_paths: tuple[str, ...] = (str(SAMPLE_CORPUS),)
    """Text files; paragraphs are documents."""
    data_roots: tuple[str, ...] = DEFAULT_DATA_ROOTS
    """The only folders a job's corpus may come from (symlinks and ``..`` resolved)."""
    default_top_k: int = 3
    """Results returned when the call does not say."""
    max_top_k: int = 10
    """Upper bound a call may ask for."""
    max_snippet_chars: int = 300
    """Each returned paragraph is cut to this many characters."""
    file_reader: FileReaderConfig = field(default_factory=FileReaderConfig)
    """Who opens a job's corpus files (an unprivileged uid when the gateway is root)."""


def _paragraphs(texts: list[str], paths: tuple[str, ...]) -> list[str]:
    docs: list[str] = []
    for text in texts:
        docs.extend(" ".join(p.split()) for p in text.split("\n\n") if p.strip())
    if not docs:
        raise ValueError(f"search corpus {paths!r} has no documents")
    return docs


class _Index:
    """BM25 over the paragraphs of some texts (the files of ``paths``)."""

    def __init__(self, bm25s: Any, texts: list[str], paths: tuple[str, ...]) -> None:
        self._bm25s = bm25s
        self.docs = _paragraphs(texts, paths)
        self._bm25 = bm25s.BM25()
        self._bm25.index(bm25s.tokenize(self.docs, stopwords="en", show_progress=False),
                         show_progress=False)

    def search(self, query: str, top_k: int, max_chars: int) -> list[tuple[float, str]]:
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        k = min(top_k, len(self.docs))
        ids, scores = self._bm25.retrieve(tokens, k=k, show_progress=False)
        pairs = zip(ids[0], scores[0], strict=True)
        return [(float(s), self.docs[int(i)][:max_chars]) for i, s in pairs if s > 0]


class SearchTool:
    """Built-in ``search``: ``{"query": "...", "top_k": 3}`` -> numbered snippets.

    The corpus is the gateway's (``SearchConfig.corpus_paths``) unless the job names its
    own (option ``corpus_paths``, from the job spec's ``tools.search_corpus``); indexes of
    job corpora are built on first use and kept for the most recent few.
    """

    name = "search"
    description = "Search the local knowledge base; returns the best matching passages."
    idempotent = True
    timeout_s = 5.0
    max_job_indexes = 4

    def __init__(self, config: SearchConfig | None = None) -> None:
        import bm25s  # lazy: heavy optional dependency lives in this adapter only

        self._config = config or SearchConfig()
        self._bm25s = bm25s
        self._roots = resolve_roots(self._config.data_roots)
        self._reader = JobFileReader(self._roots, self._config.file_reader)
        own = tuple(self._config.corpus_paths)  # the operator's files: read as the gateway
        self._default = _Index(bm25s, [Path(p).read_text(encoding="utf-8") for p in own], own)
        self._job_indexes: dict[tuple[str, ...], _Index] = {}
        self.args_schema = {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 500},
                "top_k": {"type": "integer", "minimum": 1, "maximum": self._config.max_top_k},
            },
            "required": ["query"],
            "additionalProperties": False,
        }

    def search(self, query: str, top_k: int,
               corpus_paths: tuple[str, ...] = ()) -> list[tuple[float, str]]:
        """Return up to ``top_k`` (score, snippet) pairs with a positive score."""
        return self._index(corpus_paths).search(query, top_k, self._config.max_snippet_chars)

    def _index(self, corpus_paths: tuple[str, ...]) -> _Index:
        if not corpus_paths:
            return self._default
        index = self._job_indexes.pop(corpus_paths, None) or _Index(
            self._bm25s, self._reader.read_texts(corpus_paths), corpus_paths)
        self._job_indexes[corpus_paths] = index  # most recent last
        while len(self._job_indexes) > self.max_job_indexes:
            self._job_indexes.pop(next(iter(self._job_indexes)))
        return index

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Search off the event loop (BM25 scoring is CPU work)."""
        top_k = args.get("top_k", self._config.default_top_k)
        corpus = tuple(ctx.options.get("corpus_paths", ()))
        outside = [path for path in corpus if not inside_roots(path, self._roots)]
        if outside:
            # Checked on every call, before any open: a call may come from anywhere
            # that holds the service token, not only from a job the coordinator checked.
            return ToolOutput(ok=False, error=f"corpus {outside[0]!r} is outside the data "
                                              f"roots ({describe_roots(self._roots)})")
        try:
            hits = await asyncio.to_thread(self.search, args["query"], top_k, corpus)
        except OSError as exc:  # opened as the unprivileged reader: EACCES for root-only
            return ToolOutput(ok=False, error=f"corpus unreadable: {exc.filename}: "
                                              f"{exc.strerror}{self._reader.hint(exc)}")
        if not hits:
            return ToolOutput(ok=True, output="no results")
        lines = [f"[{n}] {text}" for n, (_, text) in enumerate(hits, 1)]
        return ToolOutput(ok=True, output="\n".join(lines))
