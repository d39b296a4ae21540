"""Redis behind Sentinel: ``redis+sentinel://`` URLs and a client that follows a failover.

``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]`` names the
sentinels (any of them answers) and the service they watch (the ``sentinel monitor <service>``
name); ``rediss+sentinel://`` speaks TLS to Redis. Query options: ``sentinel_password`` (when the
sentinels have their own ``requirepass``), ``sentinel_username``.

The client is redis-py's: every new connection asks a sentinel for the current primary, and a
connection to a primary that died or was demoted fails (a demoted primary's ``READONLY`` is turned
into a connection error), so the next one finds the promoted replica. While the sentinels still
report the old primary as down and have not promoted one yet, connections fail at once: a read
degrades, a write is retried by its source from the source's position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

from redline.errors import ConfigError

SCHEMES = ("redis+sentinel", "rediss+sentinel")
EXAMPLE = "redis+sentinel://10.0.1.5:26379,10.0.2.5:26379,10.0.3.5:26379/mymaster/0"


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names a Sentinel service rather than one Redis."""
    return url.split("://", 1)[0].lower() in SCHEMES


@dataclass(frozen=True)
class SentinelAddress:
    """What a ``redis+sentinel://`` URL says."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    ssl: bool = False


def parse_sentinel_url(url: str) -> SentinelAddress:
    """The sentinels, service, database and credentials of ``url``; a malformed URL is a
    :class:`ConfigError` that shows the form expected."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ConfigError(f"not a Sentinel URL: {url!r}; expected e.g. {EXAMPLE}")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    auth, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = auth.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
        if not colon:  # redis://secret@host: a lone word is the password, as redis-py reads it
            username, password = None, unquote(user)
    sentinels = []
    for part in hosts.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ConfigError(f"{url!r}: each sentinel must be host:port (got {part!r}); "
                              f"expected e.g. {EXAMPLE}")
        sentinels.append((host.strip("[]"), int(port)))
    names = [p for p in path.split("/") if p]
    if not names or len(names) > 2 or (len(names) == 2 and not names[1].isdigit()):
        raise ConfigError(f"{url!r}: the path must be /<service>[/<db>], the name the sentinels "
                          f"monitor; expected e.g. {EXAMPLE}")
    options = {k: v[-1] for k, v in parse_qs(query).items()}
    unknown = set(options) - {"sentinel_password", "sentinel_username"}
    if unknown:
        raise ConfigError(f"{url!r}: unknown option(s) {sorted(unknown)}; a Sentinel URL "
                          "takes sentinel_password and sentinel_username")
    return SentinelAddress(sentinels, unquote(names[0]), int(names[1]) if len(names) == 2 else 0,
                           username, password, options.get("sentinel_username"),
                           options.get("sentinel_password"), scheme.lower().startswith("rediss"))


def sentinel_client(url: str, *, socket_timeout: float, socket_connect_timeout: float) -> Any:
    """A redis-py client of the service's current primary (see the module doc). The sentinels
    are asked with the same timeouts: a dead one is skipped at once, a hung one costs at most
    ``socket_connect_timeout``."""
    from redis.sentinel import Sentinel

    addr = parse_sentinel_url(url)
    sentinel_kw: dict[str, Any] = dict(socket_timeout=socket_timeout,
                                       socket_connect_timeout=socket_connect_timeout)
    if addr.sentinel_password is not None:
        sentinel_kw["password"] = addr.sentinel_password
    if addr.sentinel_username is not None:
        sentinel_kw["username"] = addr.sentinel_username
    sentinel = Sentinel(addr.sentinels, sentinel_kwargs=sentinel_kw)
    kw: dict[str, Any] = dict(socket_timeout=socket_timeout,
                              socket_connect_timeout=socket_connect_timeout, db=addr.db)
    if addr.password is not None:
        kw["password"] = addr.password
    if addr.username is not None:
        kw["username"] = addr.username
    if addr.ssl:
        kw["ssl"] = True
    return sentinel.master_for(addr.service, **kw)
