"""The settings, one class per area of ``redline.yaml``: every default in one place.

A field's comment (on its line or just above it) is what docs/settings.md says of it, and a
class's ``RULES`` the values it accepts (:mod:`redline.config.rules`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from redline.config.rules import (
    AT_LEAST_0,
    AT_LEAST_1,
    PORT,
    POSITIVE,
    SHARE,
    OneOf,
    Range,
    Rules,
)


@dataclass
class RuntimeSettings:
    """ONNX Runtime session options that matter for latency."""

    # threads one session runs an operator on (0 = ONNX Runtime's default, every core); `serve`
    # gives numpy's BLAS and faiss's OpenMP as many
    intra_op_threads: int = 1
    inter_op_threads: int = 1  # threads for independent nodes in parallel mode (0 = every core)
    graph_optimization: str = "all"  # how far ONNX Runtime rewrites a graph (fusions) at load
    execution_mode: str = "sequential"  # one node at a time, or independent branches at once
    # execution providers in order of preference (CUDAExecutionProvider needs redline[gpu]);
    # one this build lacks is skipped, and the CPU always comes last
    providers: list[str] = field(default_factory=lambda: ["CPUExecutionProvider"])
    # save the optimized graph here when set
    optimized_model_dir: str | None = field(default=None, metadata={"path": True})
    # batch sizes each version runs at load, before it serves (1 and max_batch_size are added)
    warmup_batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 32])
    warmup_runs: int = 3  # runs of each warm-up batch size (0 = none)

    RULES: ClassVar[Rules] = {
        "intra_op_threads": AT_LEAST_0, "inter_op_threads": AT_LEAST_0,  # 0 = every core
        "graph_optimization": OneOf(("disable", "basic", "extended", "all")),
        "execution_mode": OneOf(("sequential", "parallel")),
        "warmup_batch_sizes": AT_LEAST_1, "warmup_runs": AT_LEAST_0,
    }


@dataclass
class BatchingSettings:
    """Dynamic batching per model (see ``serving/batcher.py``)."""

    enabled: bool = True  # false: each request runs on its own
    max_batch_size: int = 32  # most rows in one run
    # Hold a partial batch this long for more rows, once concurrency has been seen. 0 = never:
    # requests that arrive while a batch runs ride the next one anyway ("natural" batching).
    max_queue_delay_us: int = 0
    max_queue_size: int = 1024  # requests waiting for a model; beyond: 429 with Retry-After
    adaptive: bool = False  # AIMD on the batch size against the model's slo_ms
    adaptive_target: float = 0.5  # fraction of slo_ms the slowest request of a batch may use
    # Runs predicted shorter than this happen on the event loop: below a thread hop's own cost
    # (>= 100 µs of a request's latency here) and below a one-row 3x1024 MLP (~210 µs), which
    # gains from batching (docs/architecture.md, "Findings that shape the hot path").
    inline_max_us: int = 120

    RULES: ClassVar[Rules] = {
        "max_batch_size": AT_LEAST_1, "max_queue_delay_us": AT_LEAST_0,
        "max_queue_size": AT_LEAST_1, "adaptive_target": Range(0, 1, above=True),
        "inline_max_us": AT_LEAST_0,
    }


@dataclass
class ModelSettings:
    """Per-model overrides, keyed by model name under ``models:``."""

    slo_ms: float | None = None  # this model's budget (unset: server.default_slo_ms)
    # this model's batching in place of the top-level section (keys left out take the
    # built-in defaults); unset: the top-level `batching`
    batching: BatchingSettings | None = None
    fallback: str | None = None  # name of a cheaper model to serve when the budget is short
    # /v1's answer when the budget is too short and no fallback model is set (unset: none)
    default_answer: list[float] | None = None
    # the versions kept loaded, as latest:N, all or specific:1,3 (unset: the repository's
    # policy.json)
    version_policy: str | None = None
    # a Python model's predict: thread (in the server process) or process (worker processes,
    # for Python that holds the GIL); unset: what `models add --runtime` recorded, else thread
    runtime: str | None = None
    # threads (runtime thread: the spares take over from hung runs) or worker processes
    # (runtime process: each runs a batch at once) of a Python model; unset: 4 threads, 2
    # processes
    workers: int | None = None

    RULES: ClassVar[Rules] = {"slo_ms": POSITIVE, "runtime": OneOf(("thread", "process")),
                              "workers": AT_LEAST_1}


@dataclass
class OptimizeSettings:
    """Defaults of ``redline optimize`` (each also a command-line option)."""

    tolerance: float = 0.01  # largest relative metric loss, by the worse end of the 95% interval
    guard_tolerance: float = 0.10  # largest relative loss in the guard metric (log loss)
    calibration_rows: int = 512  # rows that calibrate static int8 activation ranges
    passes: int = 5  # interleaved latency passes, one session alive at a time
    rounds: int = 300  # timed calls per candidate and batch size
    bootstrap: int = 500  # bootstrap resamples behind every interval

    RULES: ClassVar[Rules] = {
        "tolerance": AT_LEAST_0, "guard_tolerance": AT_LEAST_0,
        "calibration_rows": AT_LEAST_1, "passes": AT_LEAST_1, "rounds": AT_LEAST_1,
        "bootstrap": AT_LEAST_1,
    }


@dataclass
class ServerSettings:
    """The HTTP and gRPC listeners, their limits, readiness and shutdown."""

    host: str = "127.0.0.1"  # the address both listeners bind (0.0.0.0: every interface)
    http_port: int = 8000  # REST: V2 and /v1 (0 = any free port)
    grpc_port: int = 8001  # gRPC (0 = any free port)
    grpc_enabled: bool = True  # false: no gRPC listener (`--no-grpc`)
    # a request body or gRPC message; beyond: 413 (gRPC: RESOURCE_EXHAUSTED)
    max_body_bytes: int = 16 * 1024 * 1024
    default_slo_ms: float = 100.0  # a request's budget when neither it nor its model names one
    # the admin API (repository index, load and unload; review queue; slow requests), behind
    # admin_token; false: its routes answer 404
    admin_enabled: bool = False
    admin_token: str | None = None  # the bearer token every admin call must send
    watch_repository: bool = True  # poll the repository and hot-swap new versions in
    watch_interval_s: float = 1.0  # how often the repository is polled
    # how long in-flight requests (and a retired version's queue) may take to finish on shutdown
    drain_timeout_s: float = 10.0
    # after SIGTERM, answer not-ready but keep serving this long before closing the listeners
    drain_grace_s: float = 0.0
    # ready only when every model in the repository serves (as Triton's --strict-readiness);
    # false: ready once every model that could load did (the others answer 503, with why)
    strict_readiness: bool = True
    # What one client may hold of the HTTP edge (REST, /v1 and `redline ingest http`); each
    # refusal is a JSON error that names its setting.
    max_header_bytes: int = 64 * 1024  # a request's line and headers; beyond: 431
    max_headers: int = 100  # header fields in one request; beyond: 431
    header_timeout_s: float = 10.0  # a request's line and headers arrive within this, or 408
    body_timeout_s: float = 30.0  # a request's body arrives within this after its headers, or 408
    max_connections: int = 4096  # open HTTP connections per process; beyond: 503, closed
    # a kept-alive connection idle this long after its last answer is closed (above a load
    # balancer's own idle timeout, so the balancer never sends on a connection being closed)
    keep_alive_timeout_s: float = 30.0
    # gRPC: a message is bounded by max_body_bytes, a call's metadata (its headers) by this;
    # beyond either: RESOURCE_EXHAUSTED
    grpc_max_metadata_bytes: int = 16 * 1024

    RULES: ClassVar[Rules] = {
        "http_port": PORT, "grpc_port": PORT, "max_body_bytes": AT_LEAST_1,
        "default_slo_ms": POSITIVE, "watch_interval_s": POSITIVE,
        "drain_timeout_s": AT_LEAST_0, "drain_grace_s": AT_LEAST_0,
        "max_header_bytes": AT_LEAST_1, "max_headers": AT_LEAST_1,
        "header_timeout_s": POSITIVE, "body_timeout_s": POSITIVE,
        "max_connections": AT_LEAST_1, "keep_alive_timeout_s": POSITIVE,
        "grpc_max_metadata_bytes": AT_LEAST_1,
    }


@dataclass
class CacheSettings:
    """Per-process LRU caches on the ``/v1`` path (see ``serving/predict/cache.py``)."""

    # model outputs kept, keyed by model version and the exact input row; 0 = off
    prediction_cache_entries: int = 0
    prediction_cache_ttl_s: float = 60.0  # how long a cached output may be served
    feature_cache_entries: int = 0  # feature rows kept, keyed by version and entity; 0 = off
    feature_cache_max_staleness_ms: float = 1000.0  # how old a cached row may be when served
    # When the online store is down, a cached feature row up to this old still beats defaults.
    feature_cache_fallback_staleness_ms: float = 30000.0

    RULES: ClassVar[Rules] = {
        "prediction_cache_entries": AT_LEAST_0, "prediction_cache_ttl_s": POSITIVE,
        "feature_cache_entries": AT_LEAST_0, "feature_cache_max_staleness_ms": AT_LEAST_0,
        "feature_cache_fallback_staleness_ms": AT_LEAST_0,
    }


@dataclass
class ScalingSettings:
    """Worker processes, the local autoscaler and rollouts (see ``scaling/``)."""

    workers: int = 0  # 0 = one per core (1 when the store is in-process memory or --preload)
    min_workers: int = 0  # autoscale between min and max when max > min (0 = off)
    max_workers: int = 0  # most workers the autoscaler runs (it runs when above min_workers)
    restart_backoff_s: float = 0.5  # first wait before restarting a crash-looping worker
    max_restart_backoff_s: float = 10.0  # longest wait before a restart (doubling per crash)
    crash_window_s: float = 30.0  # crashes closer than this count as a loop
    autoscale_interval_s: float = 1.0  # how often the autoscaler decides
    queue_high: float = 4.0  # in-flight requests per worker that ask for one more
    queue_low: float = 0.5  # in-flight requests per worker below which one may go (p99 low)
    scale_up_cooldown_s: float = 5.0  # least time after a change before adding workers
    scale_down_cooldown_s: float = 30.0  # least time after a change before retiring one
    # canary/shadow rollouts every server follows (default: rollout.json in the project folder)
    rollout_file: str | None = field(default=None, metadata={"path": True})
    # The bounds a rollout starts with (`redline rollout start` flags override them; see
    # docs/scaling.md). Errors and latency, once each version has rollout_min_requests:
    rollout_min_requests: int = 200  # requests per version before errors and latency count
    rollout_max_error_rate_delta: float = 0.01  # candidate's error rate above the baseline's
    rollout_max_p99_ratio: float = 1.5  # candidate's p99 over the baseline's (and 1 ms worse)
    # The answers, once each version has rollout_min_answers rows:
    rollout_min_answers: int = 200  # rows per version before its answers are compared
    rollout_max_prediction_psi: float = 0.25  # an output's distribution vs the baseline's
    rollout_max_mismatch_rate: float = 0.2  # shadow: share of copies answering differently
    rollout_answer_rtol: float = 0.01  # shadow: relative tolerance of equal answers (allclose)
    rollout_answer_atol: float = 0.001  # shadow: absolute tolerance of equal answers
    # Realised quality, once each version has rollout_min_labels labels since the start:
    rollout_min_labels: int = 100  # labels per version since the start before quality counts
    rollout_max_loss_increase: float = 0.1  # mean squared error above the baseline's, relative

    RULES: ClassVar[Rules] = {
        "workers": AT_LEAST_0, "min_workers": AT_LEAST_0, "max_workers": AT_LEAST_0,
        "restart_backoff_s": AT_LEAST_0, "max_restart_backoff_s": AT_LEAST_0,
        "crash_window_s": POSITIVE, "autoscale_interval_s": POSITIVE,
        "queue_high": POSITIVE, "queue_low": AT_LEAST_0,
        "scale_up_cooldown_s": AT_LEAST_0, "scale_down_cooldown_s": AT_LEAST_0,
        "rollout_min_requests": AT_LEAST_1, "rollout_max_error_rate_delta": SHARE,
        "rollout_max_p99_ratio": POSITIVE, "rollout_min_answers": AT_LEAST_1,
        "rollout_max_prediction_psi": AT_LEAST_0, "rollout_max_mismatch_rate": SHARE,
        "rollout_answer_rtol": AT_LEAST_0, "rollout_answer_atol": AT_LEAST_0,
        "rollout_min_labels": AT_LEAST_1, "rollout_max_loss_increase": AT_LEAST_0,
    }


@dataclass
class PipelineSettings:
    """Entity predictions under ``/v1`` (see ``serving/predict/``)."""

    breaker_failures: int = 3  # consecutive store failures that open the circuit breaker
    breaker_reset_ms: float = 250.0  # first wait before a half-open probe (doubles, up to 8x)
    session_ttl_s: float = 1800.0  # a session's state expires this long after its last use
    session_max_events: int = 20  # request events a session keeps (the latest)
    session_max_items: int = 50  # items (id, event type, time) a session keeps, newest first
    session_events_timeout_ms: float = 1000.0  # Redis timeout of POST /v1/sessions/{id}/events
    # Item ids session events may name (one per line, or a .csv/.parquet with an item_id
    # column); empty: any id is accepted.
    session_catalogue: str | None = field(default=None, metadata={"path": True})
    max_instances: int = 1024  # rows per batch request
    latency_window: int = 512  # recent model runs the p99 for budget-aware fallback is taken over
    latency_window_s: float = 10.0  # how long a run counts in latency_window (estimates age)
    # while the p99 says "won't fit", one request per interval runs the primary anyway, so a
    # recovered model is seen
    probe_interval_ms: float = 100.0

    RULES: ClassVar[Rules] = {
        "breaker_failures": AT_LEAST_1, "breaker_reset_ms": POSITIVE,
        "session_ttl_s": POSITIVE, "session_max_events": AT_LEAST_1,
        "session_max_items": AT_LEAST_1, "session_events_timeout_ms": POSITIVE,
        "max_instances": AT_LEAST_1, "latency_window": AT_LEAST_1,
        "latency_window_s": POSITIVE, "probe_interval_ms": POSITIVE,
    }


@dataclass
class FeatureSettings:
    """Feature definitions, the online store and stream ingest (see ``features/``)."""

    # python module or file that declares entities/sources/views
    definitions: str | None = field(default=None, metadata={"path": "module-or-file"})
    store: str = "memory"  # the online store: in this process, or Redis shared by replicas
    # the Redis of the online store (store: redis): redis:// or rediss://host:port/db, or a
    # Sentinel service, redis+sentinel://host:port[,host:port...]/service[/db], whose clients
    # follow a failover
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_timeout_ms: float = 50.0  # a request's Redis read gives up after this (ingest: longer)
    # an ingest write's Redis timeout (redline ingest, a server's POST /v1/events): a batch of
    # 5,000 events runs for tens of milliseconds inside Redis, more on a loaded one
    ingest_timeout_ms: float = 10_000.0
    redis_cluster: bool = False  # redis_url names one node of a Redis Cluster
    # ingest writes wait (Redis WAIT) until this many replicas hold them before the source's
    # position moves on: no failover can drop them, for a replica's round trip a batch; 0: off
    redis_wait_replicas: int = 0
    # how long a write waits for redis_wait_replicas; then it counts as failed and is sent again
    redis_wait_timeout_ms: float = 100.0
    # The store lost its data (restarted empty, flushed): the share of /v1 rows whose entity
    # is missing over the last entity_loss_window_s is entity_loss_jump above its baseline
    # (a moving average, half-life entity_loss_baseline_half_life_s) over at least
    # entity_loss_min_rows rows (serving/entity_loss.py).
    entity_loss_window_s: float = 10.0
    entity_loss_jump: float = 0.3  # rise of the missing share over its baseline that means loss
    entity_loss_min_rows: int = 50  # rows the recent window needs before it can mean loss
    entity_loss_baseline_half_life_s: float = 600.0  # half-life of the baseline's moving average
    # /v1 reads a single Redis on the event loop's own connection (no thread hop, one wake-up
    # less a read); false: on a worker thread through redis-py
    redis_loop_reads: bool = True
    # with redis_loop_reads, a request alone in waiting for its read polls this long before
    # it sleeps: the reply (~50-100 µs on loopback) is caught without a second wake-up of the
    # process (docs/architecture.md); 0 = sleep at once
    redis_spin_us: float = 200.0
    # memory `features training-set` may use: a share of RAM ("25%") or a size ("4GB"); event
    # logs larger than this are built out of core (--engine auto)
    training_memory_budget: str = "25%"
    # feature-view versions on disk (default: <project>/features)
    registry: str = field(default=".redline/features", metadata={"path": True})
    # events replayed into the online store when `redline serve` starts (the embedded memory
    # store's history; see `redline serve --preload`)
    preload: str | None = field(default=None, metadata={"path": True})
    stream: str = "redline:events"  # Redis Stream that `redline ingest redis-stream` consumes
    consumer_group: str = "redline-ingest"  # consumer group of `redline ingest redis-stream`
    ingest_batch: int = 1000  # events per atomic write
    claim_idle_ms: int = 30000  # pending entries idle this long are claimed from dead consumers
    http_port: int = 8010  # the port `redline ingest http` listens on (POST /v1/events)
    # `redline ingest kafka` (redline[kafka]): messages keyed by entity id, JSON values
    kafka_bootstrap_servers: str = "127.0.0.1:9092"  # Kafka brokers, host:port[,host:port]
    kafka_topic: str = "redline-events"  # the topic `redline ingest kafka` consumes
    kafka_group: str = "redline-ingest"  # consumer group of `redline ingest kafka`
    # any librdkafka setting, e.g. security.protocol, sasl.mechanism, sasl.username, ssl.ca.location
    kafka_config: dict[str, str] = field(default_factory=dict)
    # `redline ingest kinesis` (redline[kinesis]): records keyed by entity id, JSON data;
    # AWS credentials as the AWS CLI finds them (environment, profile, role)
    kinesis_stream: str = "redline-events"  # the stream `redline ingest kinesis` reads
    kinesis_region: str | None = None  # its AWS region (unset: the AWS_REGION variable)
    kinesis_endpoint_url: str | None = None  # a Kinesis-compatible endpoint (unset: AWS's)

    RULES: ClassVar[Rules] = {
        "store": OneOf(("memory", "redis")), "redis_timeout_ms": POSITIVE,
        "ingest_timeout_ms": POSITIVE,
        "redis_wait_replicas": AT_LEAST_0, "redis_wait_timeout_ms": POSITIVE,
        "entity_loss_window_s": POSITIVE, "entity_loss_jump": Range(0, 1, above=True),
        "entity_loss_min_rows": AT_LEAST_1, "entity_loss_baseline_half_life_s": POSITIVE,
        "redis_spin_us": AT_LEAST_0, "ingest_batch": AT_LEAST_1, "claim_idle_ms": AT_LEAST_1,
        "http_port": PORT,
    }


@dataclass
class MonitoringSettings:
    """Metrics, traces, drift, quality, review and alerts (``redline/monitoring``)."""

    enabled: bool = True  # the request observers and /metrics; off = nothing on the request path
    tick_s: float = 1.0  # how often time series, gauges, drift and alerts are brought up to date
    # Tracing: spans are built after the request from its record; export only when configured.
    # where spans go over OTLP/HTTP, e.g. http://127.0.0.1:4318/v1/traces (needs [otel]);
    # unset: no export
    otlp_endpoint: str | None = None
    # otlp (to otlp_endpoint) | zipkin: the same spans as Zipkin v2 JSON to zipkin_endpoint
    trace_exporter: str = "otlp"
    # where Zipkin v2 JSON goes, e.g. http://127.0.0.1:9411/api/v2/spans (trace_exporter: zipkin)
    zipkin_endpoint: str | None = None
    trace_sample_ratio: float = 0.01  # head sampling; a sampled traceparent is always kept
    trace_slow_ms: float | None = None  # tail keep: slower than this (default: the model's SLO)
    trace_queue_size: int = 2048  # records waiting for export; beyond it they are dropped, counted
    slow_log_size: int = 20  # the N slowest requests of the last minute (/v1/debug/slow)
    # Drift and quality: bounded rolling windows per model version.
    drift_window_rows: int = 5000  # newest rows per version compared with its reference profile
    drift_min_rows: int = 200  # below this a window is reported but never alarms
    # Rows per second and version that enter the drift and quality windows; beyond it a uniform
    # sample (requests with a request id always enter: a label may come for them).
    window_rows_per_s: float = 200.0
    quality_join_capacity: int = 100_000  # predictions kept for a label to join (oldest go first)
    quality_join_ttl_s: float = 7 * 24 * 3600.0  # how long a prediction waits for its label
    quality_window: int = 5000  # labelled predictions the rolling quality is computed over
    quality_tolerance: float = 0.05  # alarm when quality is worse than validation by this fraction
    # Where the label join lives (monitoring/joinstore.py): auto = Redis when features.store is
    # redis (every worker and replica shares it), else the SQLite file quality_path when set (a
    # pool of workers sets one in its state directory), else this process (one worker only).
    quality_store: str = "auto"
    # the label join's SQLite file (quality_store sqlite, or auto without Redis)
    quality_path: str | None = field(default=None, metadata={"path": True})
    quality_store_timeout_ms: float = 2000.0  # a shared join slower than this answers 503
    # Human review: uncertain / out-of-range / drifted requests, at a bounded rate.
    review_per_minute: float = 30.0  # candidates one process may queue per minute
    review_capacity: int = 1000  # items awaiting a label; beyond, the oldest are dropped
    review_margin: float = 0.1  # |p - 0.5| below this counts as uncertain
    # Alerts for those who run no Prometheus: a webhook with back-off.
    alert_webhook_url: str | None = None  # POST firing and resolved alerts here (unset: none)
    alert_min_interval_s: float = 60.0  # first wait before a firing alert is sent again
    alert_max_interval_s: float = 3600.0  # longest wait between repeats (doubling from the first)

    RULES: ClassVar[Rules] = {
        "tick_s": POSITIVE, "trace_sample_ratio": SHARE,
        "trace_exporter": OneOf(("otlp", "zipkin")), "trace_slow_ms": POSITIVE,
        "trace_queue_size": AT_LEAST_1, "slow_log_size": AT_LEAST_1,
        "drift_window_rows": AT_LEAST_1, "drift_min_rows": AT_LEAST_1,
        "window_rows_per_s": AT_LEAST_0,  # 0 = every row
        "quality_join_capacity": AT_LEAST_1, "quality_join_ttl_s": POSITIVE,
        "quality_window": AT_LEAST_1, "quality_tolerance": AT_LEAST_0,
        "quality_store": OneOf(("auto", "memory", "sqlite", "redis")),
        "quality_store_timeout_ms": POSITIVE,
        "review_per_minute": AT_LEAST_0, "review_capacity": AT_LEAST_1,
        "review_margin": Range(0, 0.5), "alert_min_interval_s": POSITIVE,
        "alert_max_interval_s": POSITIVE,
    }


@dataclass
class Settings:
    """The whole configuration. ``Settings()`` is the embedded default: no services needed."""

    # one project folder: the repository and the feature registry default to models/ and
    # features/ in it
    project: str = field(default=".redline", metadata={"path": True})
    # the model repository (default: <project>/models)
    repository: str = field(default=".redline/models", metadata={"path": True})
    server: ServerSettings = field(default_factory=ServerSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    batching: BatchingSettings = field(default_factory=BatchingSettings)
    models: dict[str, ModelSettings] = field(default_factory=dict)
    features: FeatureSettings = field(default_factory=FeatureSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    pipeline: PipelineSettings = field(default_factory=PipelineSettings)
    monitoring: MonitoringSettings = field(default_factory=MonitoringSettings)
    scaling: ScalingSettings = field(default_factory=ScalingSettings)
    optimize: OptimizeSettings = field(default_factory=OptimizeSettings)
    source: str | None = None  # the file these settings came from, if any

    def for_model(self, name: str) -> ModelSettings:
        return self.models.get(name) or ModelSettings()

    def batching_for(self, name: str) -> BatchingSettings:
        return self.for_model(name).batching or self.batching
