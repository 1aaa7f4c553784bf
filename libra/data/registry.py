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


class TaskFields(Protocol):
    """What an opener reads of the spec's ``[task]`` (``libra.taskspec.TaskSpec`` has it).

    A Protocol, not the class: the task spec validates ``task.kind`` against this
    registry, so naming ``TaskSpec`` here would make the two modules import each other.
    """

    @property
    def split(self) -> str: ...
    @property
    def prompt_field(self) -> str: ...
    @property
    def messages_field(self) -> str: ...
    @property
    def reference_field(self) -> str: ...
    @property
    def metadata_field(self) -> str: ...
    @property
    def demonstration_field(self) -> str: ...
    @property
    def num_prompts(self) -> int: ...
    @property
    def seed(self) -> int: ...


class RowSource(Protocol):
    """All rows of one table, by index (a split maps its positions onto these)."""

    def __len__(self) -> int: ...

    def row(self, index: int) -> DatasetRow: ...


Opener = Callable[[TaskFields, str, str, "str | None"], RowSource]
"""``(task, path, spec field of the path, cache dir) -> RowSource``."""


@dataclass(frozen=True, slots=True)
class DatasetKind:
    """One registered kind: how to open it and how its epochs are shuffled."""

    name: str
    description: str
    open: Opener
    order: OrderFn
    is_file: bool


def field_map(task: TaskFields) -> FieldMap:
    """The spec's field mapping."""
    return FieldMap(prompt=task.prompt_field, messages=task.messages_field,
                    reference=task.reference_field, metadata=task.metadata_field,
                    demonstration=task.demonstration_field)


def _open_builtin(name: str) -> Opener:
    def open_builtin(task: TaskFields, _path: str, _field: str,
                     _cache_dir: str | None) -> RowSource:
        return BuiltinSource.generate(name, task.seed, task.num_prompts)
    return open_builtin


def _open_file(kind: str) -> Opener:
    def open_file(task: TaskFields, path: str, field: str, cache_dir: str | None) -> RowSource:
        table = open_table(kind, path, task.split, field=field, cache_dir=cache_dir)
        return FileSource(table, field_map(task), "eval" if field == "task.eval_path" else "row")
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
