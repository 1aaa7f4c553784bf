"""ListJobs pages (services/coordinator/job_pages.py): summaries, order, bounds, tokens."""

from __future__ import annotations

import base64

import pytest

from libra import types as t
from libra.errors import InvalidArgument
from services.coordinator.job_pages import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    MAX_SUMMARY_MESSAGE_CHARS,
    page_of,
    summary_of,
)


def job(index: int, created_at_ms: int | None = None, message: str = "") -> t.Job:
    return t.Job(job_id=t.JobId(f"j-{index:08x}"), name="n", state=t.JobState.SUCCEEDED,
                 spec_json='{"big": "' + "x" * 1000 + '"}',
                 created_at_ms=index if created_at_ms is None else created_at_ms,
                 updated_at_ms=0, message=message)


def all_pages(jobs: list[t.Job], page_size: int) -> list[list[str]]:
    pages, token = [], ""
    while True:
        page, token = page_of(jobs, page_size, token)
        pages.append([j.job_id for j in page])
        if not token:
            return pages


def test_a_summary_has_no_spec_and_a_bounded_message() -> None:
    long = job(1, message="m" * 5000)
    summary = summary_of(long)
    assert summary.spec_json == "" and long.spec_json  # the original is left as it was
    assert summary.message.startswith("m" * MAX_SUMMARY_MESSAGE_CHARS)
    assert summary.message.endswith("[3976 chars cut; GetJob has all]")
    assert summary_of(job(2, message="short")).message == "short"


def test_pages_cover_every_job_once_oldest_first() -> None:
    jobs = [job(i) for i in (5, 3, 9, 1, 7)]
    assert all_pages(jobs, 2) == [["j-00000001", "j-00000003"], ["j-00000005", "j-00000007"],
                                  ["j-00000009"]]
    assert all_pages(jobs, 5) == [[j.job_id for j in sorted(jobs, key=lambda j: j.job_id)]]
    assert all_pages([], 3) == [[]]


def test_equal_creation_times_are_ordered_by_id() -> None:
    jobs = [job(i, created_at_ms=42) for i in (3, 1, 2)]
    assert all_pages(jobs, 1) == [["j-00000001"], ["j-00000002"], ["j-00000003"]]


def test_a_job_created_or_gone_between_pages_shifts_nothing() -> None:
    jobs = [job(i) for i in range(1, 7)]
    first, token = page_of(jobs, 3)
    changed = [j for j in jobs if j.job_id != "j-00000002"] + [job(10)]  # one gone, one new
    second, token = page_of(changed, 3, token)
    assert [j.job_id for j in first + second] == [f"j-{i:08x}" for i in (1, 2, 3, 4, 5, 6)]
    third, token = page_of(changed, 3, token)
    assert [j.job_id for j in third] == ["j-0000000a"] and token == ""


def test_page_size_zero_is_the_default_and_the_maximum_is_enforced() -> None:
    jobs = [job(i) for i in range(DEFAULT_PAGE_SIZE + 1)]
    page, token = page_of(jobs, 0)
    assert len(page) == DEFAULT_PAGE_SIZE and token
    assert len(page_of(jobs, MAX_PAGE_SIZE)[0]) == DEFAULT_PAGE_SIZE + 1
    for bad in (-1, MAX_PAGE_SIZE + 1):
        with pytest.raises(InvalidArgument) as err:
            page_of(jobs, bad)
        assert err.value.field == "page_size"


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


def test_the_page_token_is_ascii_whatever_the_job_id() -> None:
    jobs = [t.Job(job_id=t.JobId(f"caf\u00e9-{i:08x}"), name="n", state=t.JobState.PENDING,
                  spec_json="", created_at_ms=i, updated_at_ms=0) for i in range(3)]
    page, token = page_of(jobs, 1)
    assert token.isascii() and token.isprintable()
    assert [j.job_id for j in page_of(jobs, 5, token)[0]] == ["caf\u00e9-00000001",
                                                              "caf\u00e9-00000002"]


@pytest.mark.parametrize("token", ["garbage!", "%%%", b64("12"), b64(".j-1"), b64("x.j-1"),
                                   b64("1."), "QUJD" * 200, "/w"])
def test_a_malformed_page_token_names_the_field(token: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        page_of([job(1)], 10, token)
    assert err.value.field == "page_token"
