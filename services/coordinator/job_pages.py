"""ListJobs pages: job summaries (no spec), ordered, in bounded pages (pure).

A job's spec may be 1 MiB, so a list of whole jobs outgrows a client's 4 MiB gRPC limit
after a few jobs. ListJobs therefore returns summaries: every field of the job but its
spec (GetJob has it), the message cut to ``MAX_SUMMARY_MESSAGE_CHARS``, at most
``MAX_PAGE_SIZE`` per page. A page is then at most ~500 x 5 KiB (name, ids, run dir path,
message) = ~2.5 MiB, under the limit whatever the specs.

Order: oldest first, by (created_at_ms, job_id). The page token is the last summary's
sort key (base64), so a job created or expired between two pages neither shifts nor repeats
another: each page starts strictly after the previous one's last job.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterable

from libra import types as t
from libra.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
MAX_SUMMARY_MESSAGE_CHARS = 1024
_TOKEN_SEPARATOR = "."
MAX_TOKEN_CHARS = 512


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
    """URL-safe base64 of "<created_at_ms>.<job_id>": ASCII (it travels in an HTTP
    header; a job id may hold any letter of its name) and opaque to callers."""
    key = f"{job.created_at_ms}{_TOKEN_SEPARATOR}{job.job_id}".encode()
    return base64.urlsafe_b64encode(key).decode("ascii").rstrip("=")


def _after(page_token: str) -> tuple[int, str] | None:
    if not page_token:
        return None
    try:
        if len(page_token) > MAX_TOKEN_CHARS:
            raise ValueError("too long")
        padded = page_token + "=" * (-len(page_token) % 4)
        key = base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")
    except (ValueError, UnicodeError) as exc:  # binascii.Error is a ValueError
        raise _bad_token() from exc
    created, sep, job_id = key.partition(_TOKEN_SEPARATOR)
    if not sep or not created.isdigit() or not job_id:
        raise _bad_token()
    return int(created), job_id


def _bad_token() -> InvalidArgument:
    return InvalidArgument("page_token", "not a token from a previous ListJobs answer "
                           "(next_page_token)")


def check_page_request(page_size: int, page_token: str) -> None:
    """Both ListJobs inputs, checked before anything is read (InvalidArgument)."""
    check_page_size(page_size)
    _after(page_token)


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
