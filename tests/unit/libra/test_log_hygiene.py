"""Logs a client cannot abuse: one record is one line, long client strings are cut,
repeated warnings are counted instead of written, and the log file rotates by size."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from libra.log_hygiene import RepeatLimiter, SafeMessages, clip, escape_controls
from libra.service_config import TelemetryConfig
from libra.telemetry import init_logging


def _record(msg: str, *args: object, level: int = logging.WARNING,
            name: str = "svc") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args or None, None)


def test_control_characters_are_escaped_so_a_record_stays_one_line() -> None:
    forged = "job\n2026-12-01 level=INFO logger=x forged\r\x1b[31m\x00\x85\u2028end\ttab"
    escaped = escape_controls(forged)
    assert "\n" not in escaped and "\r" not in escaped and "\x1b" not in escaped
    assert escaped == ("job\\n2026-12-01 level=INFO logger=x forged\\r\\x1b[31m\\x00\\x85"
                       "\\u2028end\\ttab")
    assert escape_controls("plain ünïcode ✓") == "plain ünïcode ✓"


def test_long_messages_are_cut_with_the_cut_length_named() -> None:
    assert clip("abc", 3) == "abc"
    assert clip("x" * 3_000_000, 10) == "x" * 10 + "...[2999990 chars cut]"


def test_the_filter_renders_args_then_escapes_and_clips() -> None:
    record = _record("[lease] granted worker_id=%s epoch=%d", "w\nforged" + "y" * 100, 3)
    assert SafeMessages(max_chars=30).filter(record)
    assert record.args is None
    assert record.getMessage() == "[lease] granted worker_id=w\\nfo...[112 chars cut]"


def test_a_url_password_in_a_message_is_masked() -> None:
    record = _record("redis error on %s", "redis://:s3cret@127.0.0.1:6379/0")
    assert SafeMessages().filter(record)
    assert record.getMessage() == "redis error on redis://:***@127.0.0.1:6379/0"


def test_a_bad_format_string_keeps_the_record() -> None:
    record = _record("needs two %s %s", "one")
    assert SafeMessages().filter(record)
    assert "needs two %s %s" in record.getMessage()


def test_repeats_past_the_burst_are_counted_and_reported_on_the_next_window() -> None:
    now = [0.0]
    limiter = RepeatLimiter(burst=3, window_s=60.0, clock=lambda: now[0])
    passed = [limiter.filter(_record("redis unreachable: %s", i)) for i in range(10)]
    assert passed == [True] * 3 + [False] * 7
    assert limiter.filter(_record("another template"))  # keyed by template
    assert limiter.filter(_record("redis unreachable: %s", 0, name="other"))  # and logger
    now[0] = 61.0
    record = _record("redis unreachable: %s", 11)
    assert limiter.filter(record)
    assert record.getMessage() == "redis unreachable: 11 [7 similar suppressed]"


def test_info_records_are_never_limited() -> None:
    limiter = RepeatLimiter(burst=1, window_s=60.0, clock=lambda: 0.0)
    assert all(limiter.filter(_record("step %d", i, level=logging.INFO)) for i in range(50))


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="burst"):
        RepeatLimiter(burst=0)
    with pytest.raises(ValueError, match="max_chars"):
        SafeMessages(max_chars=0)


@pytest.fixture
def restore_root_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        handler.close()
    root.handlers[:], root.level = handlers, level


def test_a_service_log_file_rotates_by_size_and_keeps_the_newest_lines(
        tmp_path: Path, restore_root_logging) -> None:
    log = tmp_path / "logs" / "scheduler.log"
    init_logging("scheduler", TelemetryConfig(log_file=str(log), log_max_bytes=4096,
                                              log_backup_count=2))
    logger = logging.getLogger("services.scheduler")
    for i in range(400):
        logger.info("[decision] trajectory_id=tr-%04d bucket=short", i)
    files = sorted(p.name for p in log.parent.iterdir())
    assert files == ["scheduler.log", "scheduler.log.1", "scheduler.log.2"]
    assert all(p.stat().st_size <= 4096 for p in log.parent.iterdir())
    assert "trajectory_id=tr-0399" in log.read_text()


def test_a_service_log_line_escapes_a_forged_newline(tmp_path: Path,
                                                     restore_root_logging) -> None:
    log = tmp_path / "coordinator.log"
    init_logging("coordinator", TelemetryConfig(log_file=str(log)))
    logging.getLogger("services.coordinator").info(
        "[job] created name=%s", "demo\n2026-12-01 level=ERROR forged")
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith("name=demo\\n2026-12-01 level=ERROR forged")
