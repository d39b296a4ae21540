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
