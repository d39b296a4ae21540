"""Input checks before a training set is built: a wrong column type in a Parquet file or a
missing entity column is one clear error up front, not a table of silent defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from redline.errors import InvalidInput
from redline.features.definitions import FeatureDefinitions


def _parquet_types(path: str) -> dict[str, Any] | None:
    if Path(path).suffix.lower() not in (".parquet", ".pq") or not Path(path).exists():
        return None
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise InvalidInput(f"cannot read {path}: {exc}") from exc
    return {f.name: f.type for f in schema}


def _is_id(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_dictionary(t) or pa.types.is_null(t))


def _is_time(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_timestamp(t)
                or pa.types.is_null(t))


def check_inputs(defs: FeatureDefinitions, features: list[str] | None, events_path: str,
                 labels_path: str, time_column: str) -> None:
    """Refuse Parquet columns of a type no event or label row could use."""
    from redline.features.training.kernel import feature_plan

    _, view_refs, _ = feature_plan(defs, features)
    views = [defs.view(n) for n in view_refs]
    ev = _parquet_types(events_path)
    if ev is not None:
        for v in views:
            key, ts = v.entity.join_key, v.source.timestamp
            if key in ev and not _is_id(ev[key]):
                raise InvalidInput(f"{events_path}: column '{key}' is {ev[key]}, but entity ids "
                                   "are integers or strings: write it as int64 or string")
            if ts in ev and not _is_time(ev[ts]):
                raise InvalidInput(f"{events_path}: column '{ts}' is {ev[ts]}, but event times "
                                   "are epoch milliseconds: write it as int64")
    lb = _parquet_types(labels_path)
    if lb is not None:
        for v in views:
            key = v.entity.join_key
            if key not in lb:
                raise InvalidInput(f"labels lack column '{key}' (entity '{v.entity.name}' id) "
                                   f"needed by view '{v.name}': add it to {labels_path}")
            if not _is_id(lb[key]) and not _is_time(lb[key]):
                raise InvalidInput(f"{labels_path}: column '{key}' is {lb[key]}, but entity ids "
                                   "are integers or strings: write it as int64 or string")
        if time_column in lb and not (_is_time(lb[time_column])):
            raise InvalidInput(f"{labels_path}: column '{time_column}' is {lb[time_column]}, "
                               "but label times are epoch milliseconds: write it as int64")
