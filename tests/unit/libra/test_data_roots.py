"""``libra.data_roots``: a file counts as inside a root by its real path, so neither a
symlink nor ``..`` leads out (real files and symlinks under tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra.data_roots import DEFAULT_DATA_ROOTS, check_search_corpus, resolve_roots
from libra.errors import InvalidArgument


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """``root/`` (a data root) holding ``kb.txt``, and ``secret.txt`` beside it."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "kb.txt").write_text("Paris is the capital of France.\n")
    (tmp_path / "secret.txt").write_text("root:x:0:0\n")
    return {"root": root, "kb": root / "kb.txt", "secret": tmp_path / "secret.txt"}


def refused(paths: list[str], root: Path) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        check_search_corpus(paths, resolve_roots([str(root)]))
    return err.value


def test_a_file_inside_the_root_passes(layout: dict[str, Path]) -> None:
    check_search_corpus([str(layout["kb"])], resolve_roots([str(layout["root"])]))


def test_a_file_outside_every_root_is_refused_naming_the_index_path_and_roots(
        layout: dict[str, Path]) -> None:
    err = refused([str(layout["kb"]), str(layout["secret"])], layout["root"])
    assert err.field == "tools.search_corpus[1]"
    assert str(layout["secret"]) in err.reason and str(layout["root"]) in err.reason


def test_a_symlink_inside_the_root_pointing_outside_is_refused(
        layout: dict[str, Path]) -> None:
    link = layout["root"] / "innocent.txt"
    link.symlink_to(layout["secret"])
    assert refused([str(link)], layout["root"]).field == "tools.search_corpus[0]"


def test_a_dotdot_escape_is_refused(layout: dict[str, Path]) -> None:
    escape = f"{layout['root']}/../secret.txt"
    assert refused([escape], layout["root"]).field == "tools.search_corpus[0]"


def test_a_root_that_is_a_symlink_counts_where_it_points(layout: dict[str, Path],
                                                         tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(layout["root"])
    check_search_corpus([str(alias / "kb.txt")], resolve_roots([str(alias)]))
    check_search_corpus([str(layout["kb"])], resolve_roots([str(alias)]))


def test_a_sibling_folder_sharing_the_root_prefix_is_outside(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root-evil").mkdir()
    (tmp_path / "root-evil" / "x.txt").write_text("x")
    refused([str(tmp_path / "root-evil" / "x.txt")], tmp_path / "root")


def test_the_default_roots_hold_the_shipped_corpora() -> None:
    roots = resolve_roots(DEFAULT_DATA_ROOTS)
    repo = Path(__file__).resolve().parents[3]
    check_search_corpus([str(repo / "deploy/data/almanac-corpus.txt"),
                         str(repo / "services/toolgateway/data/sample_corpus.txt")], roots)
    with pytest.raises(InvalidArgument):
        check_search_corpus(["/etc/passwd"], roots)
