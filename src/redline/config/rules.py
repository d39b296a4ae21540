"""What a setting accepts: a numeric :class:`Range` or :class:`OneOf` a few names, and the
refusal that names the key, the bad value and what to write instead."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True)
class Range:
    """The values a numeric setting accepts: finite, from ``low`` to ``high`` (both included;
    ``None``: no end), and above ``low`` rather than equal to it when ``above`` (a duration or
    an amount that must be positive)."""

    low: float | None = None
    high: float | None = None
    above: bool = False

    def refusal(self, value: Any) -> str | None:
        """What the setting must be, when ``value`` is outside the range; ``None`` inside."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None  # the type check has spoken
        inside = math.isfinite(value)
        if inside and self.low is not None:
            inside = value > self.low if self.above else value >= self.low
        if inside and self.high is not None:
            inside = value <= self.high
        return None if inside else str(self)

    def __str__(self) -> str:
        if self.low is None:
            return "a finite number" if self.high is None else f"at most {_number(self.high)}"
        low = f"more than {_number(self.low)}" if self.above else f"at least {_number(self.low)}"
        if self.high is None:
            return low
        if not self.above:
            return f"between {_number(self.low)} and {_number(self.high)}"
        return f"{low} and at most {_number(self.high)}"


@dataclass(frozen=True)
class OneOf:
    """The names a setting accepts (a typo in a store's name must not start a server)."""

    names: tuple[str, ...]

    def refusal(self, value: Any) -> str | None:
        if not isinstance(value, str) or value in self.names:
            return None
        return str(self)

    def __str__(self) -> str:
        return " or ".join(", ".join(self.names).rsplit(", ", 1))


# The ranges most settings use. Each settings class names its own in RULES, next to its fields.
AT_LEAST_0 = Range(0)  # a count or a duration where 0 means none (or off)
AT_LEAST_1 = Range(1)  # a count that must hold something
POSITIVE = Range(0, above=True)  # a duration, an interval or a budget
SHARE = Range(0, 1)  # a fraction
PORT = Range(0, 65535)  # 0 = any free port
Rules = dict[str, Range | OneOf]


def refusal(cls: type, key: str, value: Any, path: str) -> tuple[int | None, str] | None:
    """Where (a list's item, or None) and why ``value`` is outside the rule ``cls`` gives
    ``key`` (its RULES), with what to write instead; None when it is inside."""
    rule = getattr(cls, "RULES", {}).get(key)
    if rule is None or value is None:
        return None
    for index, item in enumerate(value) if isinstance(value, list) else [(None, value)]:
        need = rule.refusal(item)
        if need is not None:
            name = path if index is None else f"{path}[{index}]"
            return index, f"'{name}' must be {need}, got {item!r}"
    return None
