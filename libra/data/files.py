"""File datasets through the ``datasets`` library (the only module that imports it).

``jsonl`` and ``parquet`` files go through ``datasets.load_dataset``, which converts
them once to an Arrow file in its cache (keyed by path, size and modification time)
and memory-maps it; a ``save_to_disk`` folder (``hf-dataset``) is memory-mapped as it
is. Either way rows are read on demand: a 1M-row dataset costs each service its page
cache, not its heap. Never the network: the library's offline switch is set before any
load. ``datasets`` (with pyarrow, pandas) is imported on the first open, so services
and cores that never open a file dataset do not pay for it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from libra.data.rows import DatasetRow, FieldMap, render_row
from libra.errors import InvalidArgument
from libra.types import PromptId

if TYPE_CHECKING:
    import datasets

_LOADERS = {"jsonl": "json", "parquet": "parquet"}


def _library() -> Any:
    import datasets

    # Local files only: no Hub look-ups, no download counters.
    datasets.config.HF_HUB_OFFLINE = True
    datasets.config.HF_DATASETS_OFFLINE = True
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def open_table(kind: str, path: str, split: str, *, field: str = "task.path",
               cache_dir: str | None = None) -> datasets.Dataset:
    """The memory-mapped table of a ``jsonl``/``parquet`` file or ``hf-dataset`` folder.

    Args:
        kind: ``jsonl``, ``parquet`` or ``hf-dataset``.
        path: The file, or the ``save_to_disk`` folder.
        split: ``hf-dataset``: the split of a ``DatasetDict`` folder.
        field: The spec field named in errors (``task.path`` or ``task.eval_path``).
        cache_dir: Where converted Arrow files go (None: the library's default cache).

    Raises:
        InvalidArgument: The path is missing, of the wrong sort (file/folder), or not
            readable as ``kind``.
    """
    _check_path(kind, path, field)
    lib = _library()
    try:
        if kind == "hf-dataset":
            return _pick_split(lib.load_from_disk(path), split, path)
        return lib.load_dataset(_LOADERS[kind], data_files=os.path.abspath(path),
                                split="train", cache_dir=cache_dir)
    except InvalidArgument:
        raise
    except Exception as exc:  # the library raises many kinds; all mean "unreadable"
        raise InvalidArgument(field, f"{path!r} does not read as {kind}: "
                              f"{_reason(exc)}") from exc


def _check_path(kind: str, path: str, field: str) -> None:
    if not os.path.exists(path):
        raise InvalidArgument(field, f"{path!r} does not exist")
    if kind == "hf-dataset" and not os.path.isdir(path):
        raise InvalidArgument(field, f"{path!r} is a file; hf-dataset reads a folder "
                              "written by datasets' save_to_disk")
    if kind != "hf-dataset" and not os.path.isfile(path):
        raise InvalidArgument(field, f"{path!r} is not a file (a {kind} dataset is one file)")
    if kind != "hf-dataset" and os.path.getsize(path) == 0:
        raise InvalidArgument(field, f"{path!r} is empty: the dataset has no rows")
    if kind == "parquet" and _parquet_rows(path) == 0:
        # The library cannot load a Parquet file without rows; say what is wrong.
        raise InvalidArgument(field, f"{path!r} has no rows")


def _parquet_rows(path: str) -> int | None:
    """Rows in a Parquet file's footer (None when it is not Parquet: the load says so)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # not Parquet: the library's error is the better message
        return None


def _pick_split(loaded: Any, split: str, path: str) -> Any:
    if hasattr(loaded, "keys"):  # a DatasetDict
        if split not in loaded:
            raise InvalidArgument("task.split", f"{path!r} has no split {split!r} "
                                  f"(it has: {', '.join(sorted(loaded))})")
        return loaded[split]
    return loaded


def _reason(exc: BaseException) -> str:
    """The most telling message along the exception chain (the library wraps the cause)."""
    messages = []
    while exc is not None and len(messages) < 4:
        text = str(exc).strip()
        if text:
            messages.append(text.splitlines()[0][:300])
        exc = exc.__cause__ or exc.__context__
    return messages[-1] if messages else "unreadable"


class FileSource:
    """Rows of one table through the job's field mapping (only mapped columns are read).

    Row ``i``'s prompt id is ``<id_prefix>-<i>``: stable for the file, whatever the split.
    """

    def __init__(self, table: datasets.Dataset, fields: FieldMap, id_prefix: str) -> None:
        self.all_columns: tuple[str, ...] = tuple(table.column_names)
        columns = [c for c in fields.columns().values() if c in table.column_names]
        self.table = table.select_columns(columns)
        self.fields = fields
        self._id_prefix = id_prefix

    def __len__(self) -> int:
        return self.table.num_rows

    def row(self, index: int) -> DatasetRow:
        """Row ``index`` rendered (raises RowError when it cannot be)."""
        index = int(index)
        return render_row(self.table[index], index, self.fields,
                          PromptId(f"{self._id_prefix}-{index}"))
