"""The one way a Libra process opens Redis: a plain URL or Redis Sentinel.

``redis://[:password@]host:port/db`` (and ``rediss://``, ``unix://``) connect as always.
``redis+sentinel://[[user]:password@]host:port[,host:port...]/master_name[/db]`` asks
the sentinels which server is the master of ``master_name`` and connects there; when a
connection fails (the master died) or answers READONLY (it was demoted), the next command
asks the sentinels again, so clients follow a failover on their own. The password is the
data servers' (``requirepass``, ``sentinel auth-pass``); query options:

- ``sentinel_password``: the sentinels' own password, when they have one;
- ``min_other_sentinels`` (0): trust a sentinel's answer only when it sees at least this
  many other sentinels. Set it to quorum - 1 so a sentinel cut off with the old master
  (a network partition) cannot send clients to it.

Socket timeouts (both kinds of URL): a command whose reply has not come within
``socket_timeout`` seconds, or a connection not made within ``socket_connect_timeout``,
fails with ``TimeoutError`` (a ``ConnectionError`` to the services' retries) instead of
hanging. Both default to ``SOCKET_TIMEOUT_S`` (5 s), set here rather than left to
redis-py, whose default changed between versions (none before 6, 5 s since). A caller may
pass its own (the coordinator's lease path uses 2 s and retries inside the lease TTL);
the URL's query (``?socket_timeout=2&socket_connect_timeout=1``) overrides both. Keep
``socket_timeout`` above the longest blocking read (``XREADGROUP BLOCK``, a second or
less in Libra). A stalled Redis stalls every client alike, and a lease in it expires by
Redis's clock: see ``libra/lease_timing.py`` for how holders ride out a stall.

With no master to be found (every sentinel down, or the master down without a quorum to
promote a replica) commands raise ``MasterNotFoundError``, a ``ConnectionError``: services
report NOT_SERVING through their Redis health probe and retry as for any Redis outage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from libra.config import mask_url_password

SENTINEL_SCHEME = "redis+sentinel"
# A sentinel that does not answer within this is skipped for the next one.
SENTINEL_CONNECT_TIMEOUT_S = 1.0
# Seconds a command waits for its reply, and a connection for its handshake, by default
# (the module docstring says why it is explicit).
SOCKET_TIMEOUT_S = 5.0
_TIMEOUT_OPTIONS = ("socket_timeout", "socket_connect_timeout")
_QUERY_OPTIONS = {"sentinel_password", "min_other_sentinels", *_TIMEOUT_OPTIONS}


@dataclass(frozen=True)
class SentinelTarget:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: list[tuple[str, int]]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    min_other_sentinels: int = 0
    socket_timeout_s: float | None = None
    """From ``?socket_timeout=``: overrides the caller's (None: not given)."""
    socket_connect_timeout_s: float | None = None


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names sentinels to ask for the master rather than one server."""
    return url.lower().startswith(f"{SENTINEL_SCHEME}://")


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Parse ``redis+sentinel://...``; ValueError says what is wrong (password masked)."""
    shown = mask_url_password(url)
    parts = urlsplit(url)
    if parts.scheme.lower() != SENTINEL_SCHEME:
        raise ValueError(f"redis_url {shown}: not a {SENTINEL_SCHEME}:// URL")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    sentinels = [_host_port(item, shown) for item in hosts.split(",") if item]
    if not sentinels:
        raise ValueError(f"redis_url {shown}: no sentinel host:port")
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError(f"redis_url {shown}: the path must be /master_name[/db]")
    if len(path) == 2 and not path[1].isdigit():
        raise ValueError(f"redis_url {shown}: db must be a number, got {path[1]!r}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = sorted(set(query) - _QUERY_OPTIONS)
    if unknown:
        raise ValueError(f"redis_url {shown}: unknown options {unknown} "
                         f"(known: {sorted(_QUERY_OPTIONS)})")
    minimum = query.get("min_other_sentinels", "0")
    if not minimum.isdigit():
        raise ValueError(f"redis_url {shown}: min_other_sentinels must be a number")
    timeouts = {name: _seconds(query, name, shown) for name in _TIMEOUT_OPTIONS}
    return SentinelTarget(
        sentinels=sentinels, master_name=unquote(path[0]),
        db=int(path[1]) if len(path) == 2 else 0,
        username=unquote(username) or None, password=unquote(password) or None,
        sentinel_password=query.get("sentinel_password") or None,
        min_other_sentinels=int(minimum), socket_timeout_s=timeouts["socket_timeout"],
        socket_connect_timeout_s=timeouts["socket_connect_timeout"])


def _seconds(query: dict[str, str], name: str, shown: str) -> float | None:
    """A timeout option of the URL's query in seconds (> 0), None when not given."""
    if name not in query:
        return None
    try:
        value = float(query[name])
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"redis_url {shown}: {name} must be a number of seconds > 0, "
                         f"got {query[name]!r}")
    return value


def _with_timeouts(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with both socket timeouts set (``SOCKET_TIMEOUT_S`` unless given)."""
    return {name: SOCKET_TIMEOUT_S for name in _TIMEOUT_OPTIONS} | kwargs


def _target_timeouts(target: SentinelTarget, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the sentinel URL's own timeouts, which win (as a plain URL's)."""
    given = {"socket_timeout": target.socket_timeout_s,
             "socket_connect_timeout": target.socket_connect_timeout_s}
    return _with_timeouts(kwargs) | {k: v for k, v in given.items() if v is not None}


def _host_port(item: str, shown: str) -> tuple[str, int]:
    host, _, port = item.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"redis_url {shown}: sentinel {item!r} is not host:port")
    return host.strip("[]"), int(port)


def _sentinel_kwargs(target: SentinelTarget, kwargs: dict[str, Any],
                     retry: Any) -> dict[str, Any]:
    """Connection options for the sentinels: their own password, no retries and a short
    connect timeout. Discovery asks the sentinels in turn; redis-py's default retry
    (exponential backoff from 1 s) spent ~7 s on each dead sentinel before the next, so
    one dead sentinel of three made every command time out."""
    out = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    out.setdefault("socket_connect_timeout", SENTINEL_CONNECT_TIMEOUT_S)
    out.setdefault("socket_timeout", SENTINEL_CONNECT_TIMEOUT_S)
    out["retry"] = retry
    if target.sentinel_password:
        out["password"] = target.sentinel_password
    return out


# Connections a plain client's pool opens at most (redis-py's default); a command that
# finds them all busy waits up to POOL_WAIT_S for one.
MAX_POOL_CONNECTIONS = 100
POOL_WAIT_S = 20.0


def redis_client(url: str, **kwargs: Any) -> aioredis.Redis:
    """An asyncio client for ``url`` (plain or sentinel); ``kwargs`` as for ``from_url``.

    A plain client's pool is a blocking one: with every connection busy a command waits
    for one. The default pool raised ``MaxConnectionsError`` instead, which services
    take for a Redis outage: a coordinator serving 1,000 lease holders met bursts of
    more than 100 renewals at once, reported NOT_SERVING and let leases lapse."""
    if not is_sentinel_url(url):
        # The URL's own options (?socket_timeout=...) override these, in redis-py.
        kwargs = _with_timeouts(kwargs)
        kwargs.setdefault("max_connections", MAX_POOL_CONNECTIONS)
        kwargs.setdefault("timeout", POOL_WAIT_S)
        pool = aioredis.BlockingConnectionPool.from_url(url, **kwargs)
        client = aioredis.Redis(connection_pool=pool)
        client.auto_close_connection_pool = True  # closed with the client, as from_url's
        return client
    target = parse_sentinel_url(url)
    # The sentinels' timeouts: the caller's, else their own short one (not the URL's).
    sentinel = AsyncSentinel(target.sentinels, min_other_sentinels=target.min_other_sentinels,
                             sentinel_kwargs=_sentinel_kwargs(target, kwargs,
                                                              AsyncRetry(NoBackoff(), 0)))
    return sentinel.master_for(target.master_name, db=target.db, username=target.username,
                               password=target.password, **_target_timeouts(target, kwargs))


def redis_client_sync(url: str, **kwargs: Any) -> redis.Redis:
    """The blocking client (CLI, tests, tools) for ``url`` (plain or sentinel)."""
    if not is_sentinel_url(url):
        return redis.from_url(url, **_with_timeouts(kwargs))
    target = parse_sentinel_url(url)
    sentinel = Sentinel(target.sentinels, min_other_sentinels=target.min_other_sentinels,
                        sentinel_kwargs=_sentinel_kwargs(target, kwargs, Retry(NoBackoff(), 0)))
    return sentinel.master_for(target.master_name, db=target.db, username=target.username,
                               password=target.password, **_target_timeouts(target, kwargs))
