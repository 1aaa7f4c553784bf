"""Datasets: where a job's prompts come from (one module for every service).

``DATASET_KINDS`` is the registry of prompt sources (the built-in tasks of
``libra.tasks.TASKS`` and the file kinds ``jsonl``, ``parquet``, ``hf-dataset``);
:func:`open_job_dataset` opens a job's dataset (training and held-out splits, rows by
index, the epoch-wise serving order); :func:`check_job_dataset` is the submit-time
validation. Only ``libra/data/files.py`` touches the ``datasets`` library, lazily.
Guide: docs/datasets.md.
"""

from libra.data.check import DatasetSummary, check_job_dataset
from libra.data.dataset import DatasetSplit, Drawn, JobDataset, field_map, open_job_dataset
from libra.data.registry import (
    BUILTIN_KINDS,
    DATASET_KINDS,
    FILE_KINDS,
    DatasetKind,
    RowSource,
    SourceOptions,
)
from libra.data.rows import DatasetRow, FieldMap, Message, RowError, render_row

__all__ = [
    "BUILTIN_KINDS",
    "DATASET_KINDS",
    "FILE_KINDS",
    "DatasetKind",
    "DatasetRow",
    "DatasetSplit",
    "DatasetSummary",
    "Drawn",
    "FieldMap",
    "JobDataset",
    "Message",
    "RowError",
    "RowSource",
    "SourceOptions",
    "check_job_dataset",
    "field_map",
    "open_job_dataset",
    "render_row",
]
