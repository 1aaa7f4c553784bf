"""Log records that a client cannot abuse: escaped, truncated, and rate-limited.

Services log strings that come from callers (job names, worker ids, tool arguments,
error messages). Written verbatim, a newline in a job name forges a log line and a
3 MiB worker id makes a 3 MB line; a fault that repeats (Redis down, a peer away) writes
thousands of identical lines a minute and buries the first one. Two handler filters,
installed by :func:`libra.telemetry.init_logging` on every service's handler:

* :class:`SafeMessages` renders the message once (``msg % args``), escapes control
  characters (C0, DEL, C1 and the Unicode line/paragraph separators) so one record is
  always one line, cuts it to ``max_chars`` with a marker saying how much was cut, and
  masks the password of any URL in it.
  Tracebacks (``exc_info``) are the program's own text and stay multi-line.
* :class:`RepeatLimiter` passes at most ``burst`` records per ``window_s`` of each
  (logger, level, message template) at WARNING and above; the first record let through
  after a suppression says how many were dropped. Nothing is emitted when the storm
  simply stops (the count then shows on the next such record, if any).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from libra.config import mask_url_password

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
DEFAULT_MAX_MESSAGE_CHARS = 4096


def escape_controls(text: str) -> str:
    """``text`` with every control character written as an escape (one line)."""
    def one(match: re.Match[str]) -> str:
        char = match.group()
        if char in _NAMED:
            return _NAMED[char]
        code = ord(char)
        return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"

    return _UNSAFE.sub(one, text)


def clip(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, with a marker naming the cut length."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}...[{len(text) - max_chars} chars cut]"


class SafeMessages(logging.Filter):
    """Renders, escapes and clips each record's message (never drops a record)."""

    def __init__(self, max_chars: int = DEFAULT_MAX_MESSAGE_CHARS) -> None:
        super().__init__()
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        self._max_chars = max_chars

    def filter(self, record: logging.LogRecord) -> bool:
        """Render, escape and clip the record's message in place; always keeps the record."""
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a bad format string must not lose the record
            message = f"{record.msg!r} % {record.args!r}"
        # Clip first: escaping a huge string would cost time for nothing. A URL's password
        # (a Redis URL in an error message) never reaches a log.
        record.msg = escape_controls(mask_url_password(clip(message, self._max_chars)))
        record.args = None
        return True


@dataclass
class _Window:
    started_s: float
    passed: int = 0
    suppressed: int = 0


class RepeatLimiter(logging.Filter):
    """At most ``burst`` records per ``window_s`` per (logger, level, template) at
    ``min_level`` and above; lower levels always pass."""

    def __init__(self, burst: int = 10, window_s: float = 60.0,
                 min_level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 4096) -> None:
        super().__init__()
        if burst < 1 or window_s <= 0:
            raise ValueError(f"burst must be >= 1 and window_s > 0, got {burst} / {window_s}")
        self._burst = burst
        self._window_s = window_s
        self._min_level = min_level
        self._clock = clock
        self._max_keys = max_keys
        self._windows: dict[tuple[str, int, str], _Window] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep the record unless its key already logged ``burst`` records in this window."""
        if record.levelno < self._min_level:
            return True
        now_s = self._clock()
        key = (record.name, record.levelno, str(record.msg)[:200])
        window = self._windows.get(key)
        if window is None or now_s - window.started_s >= self._window_s:
            dropped = window.suppressed if window is not None else 0
            window = self._new_window(key, now_s)
            if dropped:
                record.msg = f"{record.msg} [{dropped} similar suppressed]"
        if window.passed >= self._burst:
            window.suppressed += 1
            return False
        window.passed += 1
        return True

    def _new_window(self, key: tuple[str, int, str], now_s: float) -> _Window:
        # Templates are a bounded set in practice; the cap guards against messages built
        # by f-string (each one its own key) growing the map without end.
        if len(self._windows) >= self._max_keys and key not in self._windows:
            self._windows.clear()
        window = self._windows[key] = _Window(now_s)
        return window
