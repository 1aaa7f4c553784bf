"""ListJobs pages: job summaries (no spec), ordered, in bounded pages (pure).

A job's spec may be 1 MiB, so a list of whole jobs outgrows a client's 4 MiB gRPC limit
after a few jobs. ListJobs therefore returns summaries: every field of the job but its
spec (GetJob has it), the message cut to ``MAX_SUMMARY_MESSAGE_CHARS``, at most
``MAX_PAGE_SIZE`` per page. A page is then at most ~500 x 5 KiB (name, ids, run dir path,
message) = ~2.5 MiB, under the limit whatever the specs.

Order: oldest first, by (created_at_ms, job_id). The page token is the last summary's
sort key, so a job created or expired between two pages neither shifts nor repeats
another: each page starts strictly after the previous one's last job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from libra import types as t
from libra.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
MAX_SUMMARY_MESSAGE_CHARS = 1024
_TOKEN_SEPARATOR = "."


def summary_of(job: t.Job) -> t.Job:
    """``job`` without its spec and with its message cut (a copy)."""
    message = job.message
    if len(message) > MAX_SUMMARY_MESSAGE_CHARS:
        cut = len(message) - MAX_SUMMARY_MESSAGE_CHARS
        message = f"{message[:MAX_SUMMARY_MESSAGE_CHARS]}...[{cut} chars cut; GetJob has all]"
    return dataclasses.replace(job, spec_json="", message=message)


def check_page_size(page_size: int) -> int:
    """0 -> the default; otherwise 1..MAX_PAGE_SIZE.

    Raises:
        InvalidArgument: ``page_size`` is negative or above the maximum.
    """
    if page_size == 0:
        return DEFAULT_PAGE_SIZE
    if not 0 < page_size <= MAX_PAGE_SIZE:
        raise InvalidArgument("page_size", f"must be in [0, {MAX_PAGE_SIZE}] (0 = "
                              f"{DEFAULT_PAGE_SIZE}), got {page_size}")
    return page_size


def _key(job: t.Job) -> tuple[int, str]:
    return job.created_at_ms, job.job_id


def _token(job: t.Job) -> str:
    return f"{job.created_at_ms}{_TOKEN_SEPARATOR}{job.job_id}"


def _after(page_token: str) -> tuple[int, str] | None:
    if not page_token:
        return None
    created, sep, job_id = page_token.partition(_TOKEN_SEPARATOR)
    if not sep or not created.isdigit() or not job_id or len(page_token) > 512:
        raise InvalidArgument("page_token", "not a token from a previous ListJobs answer "
                              "(next_page_token)")
    return int(created), job_id


def page_of(summaries: Iterable[t.Job], page_size: int,
            page_token: str = "") -> tuple[list[t.Job], str]:
    """One page of ``summaries`` and the token of the next ("" after the last page).

    Raises:
        InvalidArgument: ``page_size`` out of range or ``page_token`` malformed.
    """
    size = check_page_size(page_size)
    after = _after(page_token)
    ordered = sorted(summaries, key=_key)
    if after is not None:
        ordered = [job for job in ordered if _key(job) > after]
    page = ordered[:size]
    return page, _token(page[-1]) if len(ordered) > size else ""
