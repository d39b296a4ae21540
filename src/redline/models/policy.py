"""Which versions of a model are served, as Triton's version policies define it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redline.errors import InvalidInput


@dataclass(frozen=True)
class VersionPolicy:
    """``latest`` N versions, ``all`` versions, or ``specific`` versions."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = field(default_factory=tuple)

    @classmethod
    def latest(cls, n: int = 1) -> VersionPolicy:
        if n < 1:
            raise InvalidInput("a latest-N version policy needs N >= 1")
        return cls("latest", num_versions=n)

    @classmethod
    def all(cls) -> VersionPolicy:
        return cls("all")

    @classmethod
    def specific(cls, versions: list[int]) -> VersionPolicy:
        if not versions:
            raise InvalidInput("a specific version policy needs at least one version")
        return cls("specific", versions=tuple(sorted(set(versions))))

    @classmethod
    def parse(cls, text: str) -> VersionPolicy:
        """Parse ``latest:2``, ``all`` or ``specific:1,3`` (the CLI and config form)."""
        kind, _, arg = text.partition(":")
        try:
            if kind == "latest":
                return cls.latest(int(arg or 1))
            if kind == "all":
                return cls.all()
            if kind == "specific":
                return cls.specific([int(v) for v in arg.split(",") if v])
        except ValueError:
            pass
        raise InvalidInput(
            f"invalid version policy {text!r}: use 'latest:N', 'all' or 'specific:1,3'"
        )

    def select(self, available: list[int]) -> list[int]:
        ordered = sorted(available)
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.num_versions :]

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "latest":
            return {"latest": {"num_versions": self.num_versions}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"all": {}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VersionPolicy:
        if "latest" in d:
            return cls.latest(int(d["latest"].get("num_versions", 1)))
        if "specific" in d:
            return cls.specific([int(v) for v in d["specific"]["versions"]])
        return cls.all()

    def __str__(self) -> str:
        if self.kind == "latest":
            return f"latest:{self.num_versions}"
        if self.kind == "specific":
            return "specific:" + ",".join(map(str, self.versions))
        return "all"
