"""redline.yaml loading: defaults, typed values, and errors that name the key and line."""

from __future__ import annotations

import pytest

from redline.config import Settings, load_settings
from redline.errors import ConfigError


def test_defaults_need_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REDLINE_CONFIG", raising=False)
    settings = load_settings()
    assert settings == Settings()
    assert settings.features.store == "memory" and settings.server.http_port == 8000


def test_values_are_typed_and_nested(tmp_path):
    path = tmp_path / "redline.yaml"
    path.write_text(
        "repository: /srv/models\n"
        "server:\n  http_port: 9000\n  default_slo_ms: 20\n"
        "runtime:\n  providers: [CPUExecutionProvider]\n"
        "models:\n  fraud:\n    slo_ms: 5\n    batching:\n      max_batch_size: 8\n"
    )
    s = load_settings(path)
    assert s.repository == "/srv/models" and s.server.http_port == 9000
    assert s.server.default_slo_ms == 20.0 and isinstance(s.server.default_slo_ms, float)
    assert s.for_model("fraud").slo_ms == 5.0
    assert s.batching_for("fraud").max_batch_size == 8
    assert s.batching_for("other").max_batch_size == s.batching.max_batch_size
    assert s.source == str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server:\n  http_prot: 9000\n", r"redline\.yaml:2: unknown key 'server\.http_prot'"),
        (
            "server:\n  http_port: fast\n",
            r"redline\.yaml:2: 'server\.http_port' must be int, got str",
        ),
        ("runtime:\n  providers: CPU\n", r"redline\.yaml:2: 'runtime\.providers' must be a list"),
        ("server: 3\n", r"redline\.yaml:1: 'server' must be a mapping"),
        ("server:\n  admin_enabled: 1\n", r"'server\.admin_enabled' must be bool, got int"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_errors_name_key_and_line(tmp_path, text, message):
    path = tmp_path / "redline.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "absent.yaml")


def test_env_overrides_every_section(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "redline.yaml").write_text("server:\n  http_port: 9000\n")
    env = {
        "REDLINE_SERVER__HTTP_PORT": "9100",
        "REDLINE_FEATURES__REDIS_URL": "redis://10.0.0.1:6390/2",
        "REDLINE_RUNTIME__WARMUP_BATCH_SIZES": "[1, 4]",
        "REDLINE_MODELS__FRAUD__SLO_MS": "20",
        "REDLINE_MODELS__FRAUD__BATCHING__MAX_BATCH_SIZE": "8",
        "REDLINE_REPOSITORY": "/srv/models",
        "REDLINE_ADMIN_TOKEN": "not a setting",
        "REDLINE_SOMETHING_ELSE": "another tool's",
    }
    s = load_settings(environ=env)
    assert s.server.http_port == 9100  # the environment wins over the file
    assert s.features.redis_url == "redis://10.0.0.1:6390/2"
    assert s.runtime.warmup_batch_sizes == [1, 4]
    assert s.for_model("fraud").slo_ms == 20.0
    assert s.batching_for("fraud").max_batch_size == 8
    assert s.repository == "/srv/models"


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("REDLINE_SERVER__HTTP_PROT", "1",
         r"REDLINE_SERVER__HTTP_PROT: unknown key 'server\.http_prot'"),
        ("REDLINE_SERVER__HTTP_PORT", "fast",
         r"REDLINE_SERVER__HTTP_PORT: 'server\.http_port' must be int"),
    ],
)
def test_env_errors_name_the_variable(tmp_path, monkeypatch, var, value, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        load_settings(environ={var: value})


def test_paths_resolve_relative_to_the_file(tmp_path, monkeypatch):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "redline.yaml").write_text(
        "features:\n  definitions: features.py\n  preload: data/events.jsonl\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    s = load_settings("../proj/redline.yaml", environ={})
    base = "../proj"
    assert s.features.definitions == f"{base}/features.py"
    assert s.features.preload == f"{base}/data/events.jsonl"
    # one project folder next to the file holds the repository and the feature registry
    assert s.repository == f"{base}/.redline/models"
    assert s.features.registry == f"{base}/.redline/features"


def test_project_folder_and_module_definitions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "redline.yaml").write_text(
        "project: state\nfeatures:\n  definitions: mypkg.features\n")
    s = load_settings(environ={})
    assert s.repository == "state/models" and s.features.registry == "state/features"
    assert s.features.definitions == "mypkg.features"  # a module name is not a path
    s = load_settings(environ={"REDLINE_PROJECT": "/var/lib/redline"})
    assert s.repository == "/var/lib/redline/models"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("batching:\n  max_batch_size: -5\n",
         r"redline\.yaml:2: 'batching\.max_batch_size' must be at least 1, got -5"),
        ("batching:\n  max_queue_size: 0\n", r"'batching\.max_queue_size' must be at least 1"),
        ("server:\n  default_slo_ms: -1\n",
         r"redline\.yaml:2: 'server\.default_slo_ms' must be more than 0, got -1\.0"),
        ("runtime:\n  intra_op_threads: -2\n",
         r"'runtime\.intra_op_threads' must be at least 0, got -2"),
        ("monitoring:\n  tick_s: 0\n", r"'monitoring\.tick_s' must be more than 0, got 0\.0"),
        ("monitoring:\n  tick_s: .nan\n", r"'monitoring\.tick_s' must be more than 0, got nan"),
        ("server:\n  http_port: 70000\n",
         r"redline\.yaml:2: 'server\.http_port' must be between 0 and 65535, got 70000"),
        ("server:\n  grpc_port: -1\n", r"'server\.grpc_port' must be between 0 and 65535"),
        ("features:\n  http_port: 65536\n", r"'features\.http_port' must be between 0 and 65535"),
        ("monitoring:\n  trace_sample_ratio: 1.5\n",
         r"'monitoring\.trace_sample_ratio' must be between 0 and 1, got 1\.5"),
        ("batching:\n  adaptive_target: 0\n",
         r"'batching\.adaptive_target' must be more than 0 and at most 1"),
        ("models:\n  fraud:\n    slo_ms: 0\n    batching:\n      max_batch_size: 0\n",
         r"redline\.yaml:3: 'models\.fraud\.slo_ms' must be more than 0"),
        ("models:\n  fraud:\n    batching:\n      max_batch_size: 0\n",
         r"redline\.yaml:4: 'models\.fraud\.batching\.max_batch_size' must be at least 1"),
        ("runtime:\n  warmup_batch_sizes:\n    - 1\n    - 0\n",
         r"redline\.yaml:4: 'runtime\.warmup_batch_sizes\[1\]' must be at least 1, got 0"),
        ("features:\n  store: redsi\n",
         r"redline\.yaml:2: 'features\.store' must be memory or redis, got 'redsi'"),
        ("monitoring:\n  quality_store: sqlite3\n",
         r"'monitoring\.quality_store' must be auto, memory, sqlite or redis"),
        ("runtime:\n  graph_optimization: max\n",
         r"'runtime\.graph_optimization' must be disable, basic, extended or all"),
    ],
)
def test_values_out_of_range_name_key_line_and_range(tmp_path, text, message):
    path = tmp_path / "redline.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(path, environ={})


def test_values_at_the_ends_of_their_ranges_are_accepted(tmp_path):
    path = tmp_path / "redline.yaml"
    path.write_text("server:\n  http_port: 0\n  grpc_port: 65535\n  drain_grace_s: 0\n"
                    "runtime:\n  intra_op_threads: 0\nbatching:\n  adaptive_target: 1\n"
                    "monitoring:\n  trace_sample_ratio: 0\n  trace_slow_ms: null\n"
                    "features:\n  store: redis\n")
    s = load_settings(path, environ={})
    assert (s.server.http_port, s.server.grpc_port, s.runtime.intra_op_threads) == (0, 65535, 0)
    assert s.batching.adaptive_target == 1.0 and s.monitoring.trace_slow_ms is None


def _settings_classes() -> list[type]:
    import dataclasses
    import typing

    found: list[type] = []

    def visit(cls: type) -> None:
        if cls in found:
            return
        found.append(cls)
        for hint in typing.get_type_hints(cls).values():
            for inner in (hint, *typing.get_args(hint)):
                for arg in (inner, *typing.get_args(inner)):
                    if dataclasses.is_dataclass(arg):
                        visit(arg)  # type: ignore[arg-type]

    visit(Settings)
    return found


def test_every_numeric_setting_has_a_range():
    """A new number in the settings comes with the values it accepts (its class's RULES)."""
    import dataclasses
    import typing

    from redline.config import Range

    missing = []
    for cls in _settings_classes():
        hints = typing.get_type_hints(cls)
        rules = getattr(cls, "RULES", {})
        for f in dataclasses.fields(cls):
            kinds = {hints[f.name], *typing.get_args(hints[f.name])}
            kinds |= {a for k in list(kinds) for a in typing.get_args(k)}
            if kinds & {int, float} and not isinstance(rules.get(f.name), Range):
                missing.append(f"{cls.__name__}.{f.name}")
        assert set(rules) <= {f.name for f in dataclasses.fields(cls)}, cls  # no stale rule
    # the per-model answer is whatever the model outputs: any number
    assert missing == ["ModelSettings.default_answer"]


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("REDLINE_SERVER__HTTP_PORT", "70000",
         r"environment variable REDLINE_SERVER__HTTP_PORT: 'server\.http_port' must be between "
         r"0 and 65535, got 70000"),
        ("REDLINE_BATCHING__MAX_QUEUE_SIZE", "0", r"'batching\.max_queue_size' must be at least 1"),
        ("REDLINE_MODELS__FRAUD__BATCHING__MAX_BATCH_SIZE", "-5",
         r"'models\.fraud\.batching\.max_batch_size' must be at least 1, got -5"),
        ("REDLINE_FEATURES__STORE", "redsi", r"'features\.store' must be memory or redis"),
        ("REDLINE_RUNTIME__WARMUP_BATCH_SIZES", "[1, -8]",
         r"'runtime\.warmup_batch_sizes\[1\]' must be at least 1, got -8"),
        ("REDLINE_SERVER__HTTP_PORT", "[1",
         r"REDLINE_SERVER__HTTP_PORT: '\[1' is not valid YAML \(.*\); quote a string value"),
    ],
)
def test_env_values_out_of_range_name_the_variable(tmp_path, monkeypatch, var, value, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        load_settings(environ={var: value})


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ("server:\n  http_port: 80\n  grpc_port: [1\n", ":4:1:", "expected ',' or ']'"),
        ("server:\n\thttp_port: 1\n", ":2:1:", "found character '\\t'"),
        ("server:\n  http_port: 80\n   grpc_port: 1\n", ":3:13:",
         "mapping values are not allowed here"),
    ],
)
def test_broken_yaml_is_one_line_with_file_line_and_column(tmp_path, text, where, problem):
    path = tmp_path / "redline.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    message = caught.value.message
    assert message.startswith(f"{path}{where} not valid YAML: "), message
    assert problem in message and "\n" not in message and "<unicode string>" not in message
