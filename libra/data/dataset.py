"""A job's dataset: the training split, the held-out split and the order rows are served in.

Opened from the job spec by every party that needs prompts (the scheduler admits
groups from :meth:`DatasetSplit.draw_renderable`; the trainer's warm start reads
demonstrations; the coordinator validates at submit). Rows are read lazily by index.

Serving order: draw ``d`` (the ``d``-th prompt the job admits, counted over the whole
job) is position ``order(epoch)[d % n]`` of epoch ``d // n``, where ``n`` is the
split's size and ``order`` the kind's seeded shuffle: every row once per epoch, a new
shuffle each epoch, equal on every host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from libra.data.builtin import BuiltinSource
from libra.data.order import OrderFn, held_out
from libra.data.registry import DATASET_KINDS, RowSource, SourceOptions
from libra.data.rows import DatasetRow, FieldMap, RowError
from libra.errors import FailedPrecondition
from libra.tasks import Problem

if TYPE_CHECKING:
    from libra.taskspec import TaskSpec


@dataclass(frozen=True, slots=True)
class Drawn:
    """What :meth:`DatasetSplit.draw_renderable` served: the row, how many draws it took
    (1 + the rows skipped), and why each skipped row could not be rendered."""

    row: DatasetRow
    num_draws: int
    skipped: tuple[RowError, ...] = ()


class DatasetSplit:
    """Some rows of a source (``positions``; None: all of them, in order), shuffled per
    epoch by ``order`` seeded with ``seed``."""

    def __init__(self, source: RowSource, positions: Sequence[int] | None,
                 order: OrderFn, seed: int) -> None:
        self.source = source
        self._positions = positions
        self._order = order
        self._seed = seed
        self._epoch: tuple[int, Sequence[int]] | None = None

    def __len__(self) -> int:
        return len(self.source) if self._positions is None else len(self._positions)

    def row(self, position: int) -> DatasetRow:
        """The row at ``position`` of this split (raises RowError when unrenderable)."""
        index = position if self._positions is None else int(self._positions[position])
        return self.source.row(index)

    def epoch_order(self, epoch: int) -> Sequence[int]:
        """The positions of epoch ``epoch`` in serving order (the last one is cached)."""
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, self._order(len(self), self._seed, epoch))
        return self._epoch[1]

    def draw(self, draw_index: int) -> DatasetRow:
        """The row served at draw ``draw_index`` (see the module docstring)."""
        epoch, offset = divmod(draw_index, len(self))
        return self.row(int(self.epoch_order(epoch)[offset]))

    def draw_renderable(self, draw_index: int) -> Drawn:
        """The first renderable row from draw ``draw_index`` on: an unrenderable row is
        skipped (reported in :attr:`Drawn.skipped`) rather than stalling the job.

        Raises:
            FailedPrecondition: A whole epoch's worth of draws rendered nothing.
        """
        skipped: list[RowError] = []
        for step in range(len(self)):
            try:
                return Drawn(self.draw(draw_index + step), step + 1, tuple(skipped))
            except RowError as exc:
                skipped.append(exc)
        raise FailedPrecondition(f"no row of the dataset can be rendered (last: {skipped[-1]})"
                                 if skipped else "the dataset split is empty")

    def problems(self) -> list[Problem] | None:
        """The built-in problems of this split in position order (the warm start's
        demonstrations need their expressions); None for a file dataset."""
        if not isinstance(self.source, BuiltinSource):
            return None
        if self._positions is None:
            return list(self.source.problems)
        return [self.source.problems[int(i)] for i in self._positions]


@dataclass(frozen=True, slots=True)
class JobDataset:
    """The job's ``train`` split and its held-out ``eval`` split (None: no eval)."""

    kind: str
    train: DatasetSplit
    eval: DatasetSplit | None


def field_map(task: TaskSpec) -> FieldMap:
    """The spec's mapping of dataset columns (``task.prompt_field``, ...) to row parts."""
    return FieldMap(prompt=task.prompt_field, messages=task.messages_field,
                    reference=task.reference_field, metadata=task.metadata_field,
                    demonstration=task.demonstration_field)


def open_job_dataset(task: TaskSpec, *, cache_dir: str | None = None) -> JobDataset:
    """Open the dataset ``task`` describes (a validated spec's ``[task]``).

    The held-out split is ``task.eval_path`` (same kind and mapping), or a seeded
    ``task.eval_fraction`` of the rows; a file dataset's ``task.num_prompts`` > 0 keeps
    the first that many training rows.

    Raises:
        InvalidArgument: The file is missing or unreadable (names ``task.path`` or
            ``task.eval_path``).
    """
    kind = DATASET_KINDS[task.resolved_kind]
    seed = task.order_seed
    options = SourceOptions(field_map(task), task.split, task.seed, task.num_prompts)
    source = kind.open(options, task.path, "task.path", cache_dir)
    train: Sequence[int] | None = None
    eval_split = None
    if task.eval_path:
        eval_split = DatasetSplit(kind.open(options, task.eval_path, "task.eval_path", cache_dir),
                                  None, kind.order, seed)
    elif task.eval_fraction > 0:
        train, held = held_out(len(source), task.eval_fraction, seed)
        eval_split = DatasetSplit(source, held, kind.order, seed)
    if kind.is_file and 0 < task.num_prompts < (len(source) if train is None else len(train)):
        train = (range(len(source)) if train is None else train)[:task.num_prompts]
    return JobDataset(kind.name, DatasetSplit(source, train, kind.order, seed), eval_split)
