"""Scale and availability: worker processes, autoscaling, rollouts, and a hedging client.

Public face: :class:`Client`/:class:`AsyncClient` (also ``redline.Client``), the supervisor
(``workers``), the autoscaler's decision function and the rollout state. Imported lazily so
``import redline`` stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AsyncClient", "Client", "InferResult"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from redline.scaling import client

        return getattr(client, name)
    raise AttributeError(f"module 'redline.scaling' has no attribute {name!r}")
