"""The single definition of time for every feature: event time → tile, query time → tiles.

Online stores and the offline builder both call these functions and nothing else decides which
events a window holds, so online and offline values agree by construction.

Semantics (all times are integer epoch milliseconds, event time):

* A window of length ``w`` is kept as tiles of size ``s`` (``w`` a multiple of ``s``, ``k = w/s``).
  An event with time ``ts`` belongs to tile ``ts // s`` (the half-open interval ``[i*s, (i+1)*s)``).
* A read at time ``t`` covers tiles ``t//s - k + 1 .. t//s``: event times in
  ``[(t//s - k + 1) * s, (t//s + 1) * s)`` — start inclusive, end exclusive. The window slides in
  steps of one tile, so its effective length is between ``w - s`` (exclusive) and ``w``.
* The default tile size is the largest of :data:`TILE_LADDER_MS` that divides ``w`` into at least
  :data:`MIN_TILES_PER_WINDOW` tiles (1 min → 5 s, 5 min → 30 s, 1 h → 5 min, 24 h → 2 h,
  7 d → 12 h): each read merges about a dozen tiles per window, and the window's edge moves in
  steps of at most a tenth of its length.
* An event is visible from its *arrival* (ingest) time on; it is dead-lettered as ``late`` when
  ``arrival - ts > allowed_lateness`` and as ``future`` when ``ts - arrival > max_clock_skew``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

SECOND = 1000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR

MIN_TILES_PER_WINDOW = 10
TILE_LADDER_MS: tuple[int, ...] = (
    1, 10, 100, SECOND, 5 * SECOND, 10 * SECOND, 30 * SECOND, MINUTE, 5 * MINUTE, 10 * MINUTE,
    30 * MINUTE, HOUR, 2 * HOUR, 6 * HOUR, 12 * HOUR, DAY,
)

_UNITS = {"ms": 1, "s": SECOND, "m": MINUTE, "h": HOUR, "d": DAY}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")


def parse_duration(value: str | int) -> int:
    """``"90s"``, ``"5m"``, ``"1h"``, ``"7d"``, ``"250ms"`` or an int of milliseconds → ms.

    >>> parse_duration("1h"), parse_duration("250ms"), parse_duration(30)
    (3600000, 250, 30)
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"duration must be >= 0, got {value}")
        return value
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(
            f"not a duration: {value!r} (write e.g. '250ms', '30s', '5m', '1h', '7d')"
        )
    return int(match.group(1)) * _UNITS[match.group(2)]


def format_duration(ms: int) -> str:
    """The shortest exact spelling of ``ms`` (used in feature names): 3600000 → ``"1h"``."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNITS[unit] == 0:
            return f"{ms // _UNITS[unit]}{unit}"
    return f"{ms}ms"


def default_tile_ms(window_ms: int) -> int:
    """Largest ladder tile that divides the window into >= MIN_TILES_PER_WINDOW tiles.

    >>> [format_duration(default_tile_ms(parse_duration(w))) for w in ("1m", "5m", "1h", "7d")]
    ['5s', '30s', '5m', '12h']
    """
    best = 1
    for tile in TILE_LADDER_MS:
        if window_ms % tile == 0 and window_ms // tile >= MIN_TILES_PER_WINDOW:
            best = tile
    return best


@dataclass(frozen=True)
class TileWindow:
    """A window of ``k`` tiles of ``tile_ms`` each; all tile arithmetic goes through here."""

    window_ms: int
    tile_ms: int

    def __post_init__(self) -> None:
        if self.window_ms <= 0 or self.tile_ms <= 0 or self.window_ms % self.tile_ms:
            raise ValueError(
                f"window {self.window_ms} ms must be a positive multiple of its tile "
                f"{self.tile_ms} ms"
            )

    @property
    def tiles(self) -> int:
        return self.window_ms // self.tile_ms

    def tile_of(self, ts_ms: int) -> int:
        """The tile an event at ``ts_ms`` belongs to."""
        return ts_ms // self.tile_ms

    def covering(self, now_ms: int) -> tuple[int, int]:
        """Inclusive tile range ``(first, last)`` a read at ``now_ms`` merges.

        >>> TileWindow(60_000, 5_000).covering(61_000)
        (1, 12)
        """
        last = now_ms // self.tile_ms
        return last - self.tiles + 1, last

    def tile_of_array(self, ts_ms: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`tile_of` (floor division, also for negative times)."""
        return np.floor_divide(ts_ms, self.tile_ms)

    def covering_array(self, now_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised :meth:`covering`."""
        last = np.floor_divide(now_ms, self.tile_ms)
        return last - self.tiles + 1, last


def ring_size(tiles: int, tile_ms: int, max_clock_skew_ms: int) -> int:
    """Tile slots an online store keeps per tile grid: the window plus the future-skew tiles.

    Slot ``i % ring`` holds tile ``i``. With arrivals in order, an accepted event's tile is never
    older than ``tile(arrival) - tiles + 1`` nor newer than ``tile(arrival + skew)``, so a slot is
    never reused while a read can still need its tile.
    """
    return tiles + -(-max_clock_skew_ms // tile_ms) + 1


def admit(ts_ms: int, arrival_ms: int, allowed_lateness_ms: int, max_clock_skew_ms: int) -> str:
    """Why an event is refused by time (``"late"``/``"future"``), or ``""`` if admitted."""
    if arrival_ms - ts_ms > allowed_lateness_ms:
        return "late"
    if ts_ms - arrival_ms > max_clock_skew_ms:
        return "future"
    return ""


def admitted_array(ts_ms: np.ndarray, arrival_ms: np.ndarray, allowed_lateness_ms: int,
                   max_clock_skew_ms: int) -> np.ndarray:
    """Vectorised :func:`admit`: True where an event is neither late nor from the future."""
    lag = arrival_ms - ts_ms
    return (lag <= allowed_lateness_ms) & (-lag <= max_clock_skew_ms)


def place(ts_ms: int, arrival_ms: int, tile_ms: int, tiles: int, ring: int
          ) -> tuple[int, int] | None:
    """(tile, ring slot) an event updates on one tile grid of ``tiles`` per window, or ``None``
    when no read at or after its arrival can see its tile (it is then skipped, not an error).

    >>> place(61_000, 61_000, 5_000, 12, 14), place(1_000, 61_000, 5_000, 12, 14)
    ((12, 12), None)
    """
    tile = ts_ms // tile_ms
    if tile < arrival_ms // tile_ms - tiles + 1:
        return None
    return tile, tile % ring
