"""``redline.yaml`` → typed settings. Every default lives here, in one place.

Loading is strict: an unknown key or a value of the wrong type is a :class:`ConfigError` that
names the key path and the line of the file, because a typo in a latency setting silently falling
back to a default is worse than a refusal to start.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from redline.errors import ConfigError

DEFAULT_CONFIG_FILE = "redline.yaml"


@dataclass
class RuntimeSettings:
    """ONNX Runtime session options that matter for latency."""

    intra_op_threads: int = 1
    inter_op_threads: int = 1
    graph_optimization: str = "all"  # disable | basic | extended | all
    execution_mode: str = "sequential"  # sequential | parallel
    providers: list[str] = field(default_factory=lambda: ["CPUExecutionProvider"])
    optimized_model_dir: str | None = None  # save the optimized graph here when set
    warmup_batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 32])
    warmup_runs: int = 3


@dataclass
class BatchingSettings:
    """Dynamic batching per model (see ``serving/batcher.py``)."""

    enabled: bool = True
    max_batch_size: int = 32
    # Hold a partial batch this long for more rows, once concurrency has been seen. 0 = never:
    # requests that arrive while a batch runs ride the next one anyway ("natural" batching).
    max_queue_delay_us: int = 0
    max_queue_size: int = 1024
    adaptive: bool = False  # AIMD on the batch size against the model's slo_ms
    adaptive_target: float = 0.5  # fraction of slo_ms the slowest request of a batch may use
    inline_max_us: int = 50  # runs predicted shorter than this happen on the event loop


@dataclass
class ModelSettings:
    """Per-model overrides, keyed by model name under ``models:``."""

    slo_ms: float | None = None
    batching: BatchingSettings | None = None
    fallback: str | None = None  # name of a cheaper model to serve when the budget is short
    default_answer: list[float] | None = None
    version_policy: str | None = None  # "latest:N" | "all" | "specific:1,3"


@dataclass
class OptimizeSettings:
    """Defaults of ``redline optimize`` (each also a command-line option)."""

    tolerance: float = 0.01  # largest relative metric loss, by the worse end of the 95% interval
    guard_tolerance: float = 0.10  # largest relative loss in the guard metric (log loss)
    calibration_rows: int = 512  # rows that calibrate static int8 activation ranges
    passes: int = 5  # interleaved latency passes, one session alive at a time
    rounds: int = 300  # timed calls per candidate and batch size
    bootstrap: int = 500  # bootstrap resamples behind every interval


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    grpc_enabled: bool = True
    max_body_bytes: int = 16 * 1024 * 1024
    default_slo_ms: float = 100.0
    admin_enabled: bool = False
    admin_token: str | None = None
    watch_repository: bool = True
    watch_interval_s: float = 1.0
    drain_timeout_s: float = 10.0


@dataclass
class CacheSettings:
    prediction_cache_entries: int = 0  # 0 = off
    prediction_cache_ttl_s: float = 60.0
    feature_cache_entries: int = 0  # 0 = off
    feature_cache_max_staleness_ms: float = 1000.0
    # When the online store is down, a cached feature row up to this old still beats defaults.
    feature_cache_fallback_staleness_ms: float = 30000.0


@dataclass
class PipelineSettings:
    """Entity predictions under ``/v1`` (see ``serving/pipeline.py``)."""

    breaker_failures: int = 3  # consecutive store failures that open the circuit breaker
    breaker_reset_ms: float = 250.0  # first wait before a half-open probe (doubles, up to 8x)
    session_ttl_s: float = 1800.0
    session_max_events: int = 20
    max_instances: int = 1024  # rows per batch request
    latency_window: int = 512  # recent model runs the p99 for budget-aware fallback is taken over


@dataclass
class FeatureSettings:
    definitions: str | None = None  # python module or file that declares entities/sources/views
    store: str = "memory"  # memory | redis
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_timeout_ms: float = 50.0
    redis_cluster: bool = False  # redis_url names one node of a Redis Cluster
    registry: str = ".redline/features"
    stream: str = "redline:events"  # Redis Stream that `redline ingest redis-stream` consumes
    consumer_group: str = "redline-ingest"
    ingest_batch: int = 1000  # events per atomic write
    claim_idle_ms: int = 30000  # pending entries idle this long are claimed from dead consumers
    http_port: int = 8010  # `redline ingest http` (POST /v1/events)


@dataclass
class Settings:
    """The whole configuration. ``Settings()`` is the embedded default: no services needed."""

    repository: str = ".redline/models"
    server: ServerSettings = field(default_factory=ServerSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    batching: BatchingSettings = field(default_factory=BatchingSettings)
    models: dict[str, ModelSettings] = field(default_factory=dict)
    features: FeatureSettings = field(default_factory=FeatureSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    pipeline: PipelineSettings = field(default_factory=PipelineSettings)
    optimize: OptimizeSettings = field(default_factory=OptimizeSettings)
    source: str | None = None  # the file these settings came from, if any

    def for_model(self, name: str) -> ModelSettings:
        return self.models.get(name) or ModelSettings()

    def batching_for(self, name: str) -> BatchingSettings:
        return self.for_model(name).batching or self.batching


def load_settings(path: str | os.PathLike[str] | None = None) -> Settings:
    """Load settings from ``path``, or ``./redline.yaml`` if it exists, or the defaults."""
    if path is None:
        env_path = os.environ.get("REDLINE_CONFIG")
        path = env_path or (DEFAULT_CONFIG_FILE if Path(DEFAULT_CONFIG_FILE).exists() else None)
    if path is None:
        return Settings()
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from exc
    try:
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from exc
    if node is None:
        return Settings(source=str(file))
    settings = _build(Settings, node, str(file), "")
    settings.source = str(file)
    return settings


def _where(file: str, node: yaml.Node) -> str:
    return f"{file}:{node.start_mark.line + 1}"


def _build(cls: type, node: yaml.Node, file: str, prefix: str) -> Any:
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{_where(file, node)}: '{prefix or 'top level'}' must be a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.name != "source"}
    values: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = key_node.value
        path = f"{prefix}.{key}" if prefix else key
        if key not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(f"{_where(file, key_node)}: unknown key '{path}' (known: {known})")
        values[key] = _convert(hints[key], value_node, file, path)
    return cls(**values)


def _convert(hint: Any, node: yaml.Node, file: str, path: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            if type(None) in args:
                return None
        non_none = [a for a in args if a is not type(None)]
        return _convert(non_none[0], node, file, path)
    if dataclasses.is_dataclass(hint):
        return _build(hint, node, file, path)  # type: ignore[arg-type]
    if origin is list:
        if not isinstance(node, yaml.SequenceNode):
            raise ConfigError(f"{_where(file, node)}: '{path}' must be a list")
        return [_convert(args[0], item, file, f"{path}[{i}]") for i, item in enumerate(node.value)]
    if origin is dict:
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(f"{_where(file, node)}: '{path}' must be a mapping")
        return {k.value: _convert(args[1], v, file, f"{path}.{k.value}") for k, v in node.value}
    if not isinstance(node, yaml.ScalarNode):
        raise ConfigError(f"{_where(file, node)}: '{path}' must be a single {hint.__name__}")
    value = yaml.safe_load(yaml.serialize(node))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is Any or (isinstance(value, hint) and not (hint is int and isinstance(value, bool))):
        return value
    raise ConfigError(
        f"{_where(file, node)}: '{path}' must be {hint.__name__}, got {type(value).__name__} "
        f"{value!r}"
    )
