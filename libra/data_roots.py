"""Data roots: the only folders whose files a tool may read (search corpora, ...).

A job names files (``tools.search_corpus``); the coordinator checks them at submit
against its ``tool_data_roots`` and the tool gateway again before it opens one
(``data_roots``), since the gateway also serves calls that never passed a submit. A
path is inside a root when its real path (symlinks followed, ``..`` folded) is under
the root's real path, so neither a symlink nor ``..`` can lead out of a root.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from libra.errors import InvalidArgument

_REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA_ROOTS: tuple[str, ...] = (str(_REPO / "deploy" / "data"),
                                       str(_REPO / "services" / "toolgateway" / "data"))
"""The repository's example data and the gateway's built-in corpus."""


def resolve_roots(roots: Iterable[str]) -> tuple[Path, ...]:
    """Each root's real path (a root that is itself a symlink counts where it points)."""
    return tuple(Path(root).expanduser().resolve() for root in roots)


def inside_roots(path: str, roots: Sequence[Path]) -> bool:
    """Whether ``path``'s real path lies under one of ``roots`` (already resolved).

    Relative paths resolve against the current directory, as the file would be opened.
    """
    real = Path(path).expanduser().resolve()
    return any(real.is_relative_to(root) for root in roots)


def describe_roots(roots: Sequence[Path]) -> str:
    """The roots as one line for error messages ("(none configured)" when empty)."""
    return ", ".join(str(root) for root in roots) or "(none configured)"


def check_search_corpus(paths: Sequence[str], roots: Sequence[Path],
                        field: str = "tools.search_corpus") -> None:
    """Every corpus file lies inside a data root.

    Raises:
        InvalidArgument: naming ``<field>[i]``, the path and the roots.
    """
    for index, path in enumerate(paths):
        if not inside_roots(path, roots):
            raise InvalidArgument(f"{field}[{index}]", f"{path!r} is outside the tool data "
                                  f"roots ({describe_roots(roots)}): put the file under one "
                                  "of them or add its folder to the roots")
