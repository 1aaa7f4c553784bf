"""The registry of dataset kinds: the only list of what ``[task] kind`` may be.

Every built-in task of ``libra.tasks.TASKS`` is a kind (``arith``, ``calc-words``:
generated prompts, the legacy epoch shuffle); the file kinds read a local file or
folder through ``datasets`` (``jsonl``, ``parquet``, ``hf-dataset``). The job spec
validates ``task.kind`` against this registry; :func:`libra.data.open_job_dataset`
opens a job's dataset through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from libra.data.builtin import BuiltinSource
from libra.data.files import FileSource, open_table
from libra.data.order import OrderFn, legacy_order, permuted_order
from libra.data.rows import DatasetRow, FieldMap
from libra.tasks import TASKS


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """What an opener needs of the spec's ``[task]``: the column mapping, the split, and
    a built-in task's seed and size. ``libra.data.dataset`` builds it from the
    ``TaskSpec``; the registry never names that class, because the task spec validates
    ``task.kind`` against this registry and the two would import each other."""

    fields: FieldMap
    split: str
    seed: int
    num_prompts: int


class RowSource(Protocol):
    """All rows of one table, by index (a split maps its positions onto these)."""

    def __len__(self) -> int: ...

    def row(self, index: int) -> DatasetRow:
        """Row ``index`` (0 <= index < len)."""


Opener = Callable[[SourceOptions, str, str, "str | None"], RowSource]
"""``(options, path, spec field of the path, cache dir) -> RowSource``."""


@dataclass(frozen=True, slots=True)
class DatasetKind:
    """One registered kind: how to open it and how its epochs are shuffled."""

    name: str
    description: str
    open: Opener
    order: OrderFn
    is_file: bool


def _open_builtin(name: str) -> Opener:
    def open_builtin(options: SourceOptions, _path: str, _field: str,
                     _cache_dir: str | None) -> RowSource:
        return BuiltinSource.generate(name, options.seed, options.num_prompts)
    return open_builtin


def _open_file(kind: str) -> Opener:
    def open_file(options: SourceOptions, path: str, field: str,
                  cache_dir: str | None) -> RowSource:
        table = open_table(kind, path, options.split, field=field, cache_dir=cache_dir)
        return FileSource(table, options.fields,
                          "eval" if field == "task.eval_path" else "row")
    return open_file


DATASET_KINDS: dict[str, DatasetKind] = {
    **{name: DatasetKind(name, f"built-in task {name!r} (libra/tasks)", _open_builtin(name),
                         legacy_order, is_file=False) for name in TASKS},
    "jsonl": DatasetKind("jsonl", "a JSON Lines file, one object per row",
                         _open_file("jsonl"), permuted_order, is_file=True),
    "parquet": DatasetKind("parquet", "a Parquet file", _open_file("parquet"),
                           permuted_order, is_file=True),
    "hf-dataset": DatasetKind("hf-dataset", "a folder written by datasets' save_to_disk "
                              "(a Dataset, or a DatasetDict and task.split)",
                              _open_file("hf-dataset"), permuted_order, is_file=True),
}
FILE_KINDS: tuple[str, ...] = tuple(k for k, v in DATASET_KINDS.items() if v.is_file)
BUILTIN_KINDS: tuple[str, ...] = tuple(k for k, v in DATASET_KINDS.items() if not v.is_file)
