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
