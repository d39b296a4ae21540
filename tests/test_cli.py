"""One shape for the CLI: every command documents every option and shows examples, and every
command given bad arguments answers one line ``error [code]: message`` with exit 2, never a
traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest

from redline.cli import COMMANDS, cli, main


def all_commands() -> list[tuple[str, click.Command]]:
    """Every command and subcommand, by its full name (``models add``)."""
    out: list[tuple[str, click.Command]] = []
    ctx = click.Context(cli)
    for name in sorted(COMMANDS):
        command = cli.get_command(ctx, name)
        assert command is not None, name
        out.append((name, command))
        if isinstance(command, click.Group):
            for sub in sorted(command.commands):
                out.append((f"{name} {sub}", command.commands[sub]))
    return out


COMMAND_NAMES = [name for name, _ in all_commands()]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("name", COMMAND_NAMES)
def test_every_option_has_help_and_every_command_examples(name: str) -> None:
    command = dict(all_commands())[name]
    undocumented = [p.name for p in command.params
                    if isinstance(p, click.Option) and not p.hidden and not p.help]
    assert not undocumented, f"`redline {name}`: options without help text: {undocumented}"
    assert "Examples:" in (command.help or ""), f"`redline {name} --help` shows no examples"


@pytest.mark.parametrize("name", COMMAND_NAMES)
def test_conventions(name: str) -> None:
    """-m/--model names the model; ports are --http-port/--grpc-port; --json is a flag."""
    command = dict(all_commands())[name]
    for p in command.params:
        if not isinstance(p, click.Option) or p.hidden:  # hidden: an old name kept working
            continue
        if "--model" in p.opts:
            assert "-m" in p.opts, f"`redline {name}`: --model without -m"
        assert "--port" not in p.opts, f"`redline {name}`: --port (use --http-port/--grpc-port)"
        if "--json" in p.opts:
            assert p.is_flag, f"`redline {name}`: --json takes a file (use --json-out FILE)"


@pytest.mark.parametrize("name", COMMAND_NAMES)
def test_bad_arguments_give_one_error_line(name: str, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # no redline.yaml, an empty repository
    code, out, err = run(capsys, *name.split(), "--no-such-option")
    assert code == 2
    assert err.startswith("error [usage]: No such option"), err
    assert "Traceback" not in err + out


# Each command with arguments a user could plausibly get wrong (in an empty folder).
BAD_CALLS = [
    ["models", "add"],
    ["models", "add", "-m", "x", "missing.onnx"],
    ["models", "add", "-m", "x", "model.onnx", "--version", "two"],
    ["models", "show", "-m", "nosuch"],
    ["models", "remove", "-m", "nosuch", "--version", "1"],
    ["models", "promote", "-m", "nosuch", "--version", "1"],
    ["models", "promote", "-m", "x"],
    ["models", "rollback", "-m", "nosuch"],
    ["models", "policy", "-m", "nosuch", "sometimes"],
    ["models", "list", "--config", "missing.yaml"],
    ["predict", "-m", "nosuch", "-i", "[[1, 2]]"],
    ["predict", "-m", "nosuch", "-i", "@missing.json"],
    ["serve", "--config", "missing.yaml"],
    ["serve", "--http-port", "http"],
    ["bench", "-m", "x", "--url", "127.0.0.1:9"],
    ["bench", "-m", "x", "--v1", "{not json"],
    ["bench", "-m", "x", "--input", "X"],
    ["features", "list"],
    ["features", "plan", "-d", "missing.py"],
    ["features", "apply", "-d", "missing.py"],
    ["features", "training-set", "-d", "missing.py", "--events", "e.jsonl", "--labels", "l.csv",
     "--out", "o.parquet"],
    ["features", "verify"],
    ["ingest", "file", "missing.jsonl"],
    ["ingest", "http", "-d", "missing.py"],
    ["ingest", "redis-stream", "-d", "missing.py"],
    ["optimize", "-m", "nosuch", "--data", "val.npz"],
    ["gate", "-m", "nosuch", "--candidate", "2", "--data", "val.npz"],
    ["init", "."],
]


@pytest.mark.parametrize("args", BAD_CALLS, ids=" ".join)
def test_user_errors_have_codes_not_tracebacks(args, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"not onnx")
    if args[0] == "init":
        (tmp_path / "redline.yaml").write_text("# already a project\n")
    code, out, err = run(capsys, *args)
    assert code == 2, (code, out, err)
    assert err.startswith("error ["), err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err + out


def test_missing_optional_dependency_names_the_extra(capsys, monkeypatch) -> None:
    import redline.cli as cli_module

    def no_redis(*_a: object, **_k: object) -> None:
        raise ModuleNotFoundError("No module named 'redis'", name="redis")

    monkeypatch.setattr(cli_module.cli, "main", no_redis)
    code, _, err = run(capsys, "serve")
    assert code == 2
    assert err.strip() == (
        "error [missing_dependency]: this needs the optional package 'redis', which is not "
        "installed; install it with pip install 'redline[redis]' (or `make demo`, which "
        "installs the demo extras)")


@pytest.mark.slow
def test_usage_error_from_a_real_process() -> None:
    """The installed entry point, not just ``main``: one line, exit 2."""
    done = subprocess.run([sys.executable, "-m", "redline.cli", "models", "add"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("error [usage]: name the model with -m/--model NAME")
    assert "Traceback" not in done.stderr


def tiny_onnx() -> bytes:
    """A two-feature regressor (y = x0 + x1) made with onnx.helper: no converter needed."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((2, 1), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["variable"])], "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None, 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def test_a_model_name_without_m_is_refused_with_the_usage(capsys, tmp_path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(tiny_onnx())
    repo = str(tmp_path / "repo")
    # the name where SOURCE is expected: refused, nothing stored
    code, _, err = run(capsys, "models", "add", "fraud", str(model), "-r", repo)
    assert code == 2 and "`redline models add -m NAME SOURCE`" in err
    assert not (tmp_path / "repo" / "fraud").exists()
    code, _, err = run(capsys, "models", "add", str(model), "-r", repo)
    assert code == 2 and "-m/--model NAME" in err
    assert run(capsys, "models", "add", "-m", "bc", str(model), "-r", repo)[0] == 0
    code, _, err = run(capsys, "models", "promote", "-m", "bc", "1", "-r", repo)
    assert code == 2 and "--version" in err
    code, out, _ = run(capsys, "models", "promote", "-m", "bc", "--version", "1", "-r", repo)
    assert code == 0 and "production -> version 1" in out


def test_the_top_level_help_teaches_the_one_shape(capsys) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    adds = [line for line in out.splitlines() if "models add" in line]
    assert adds and all(" -m " in line for line in adds)


def test_ingest_http_takes_its_port_as_http_port_only() -> None:
    import click

    from redline.commands.ingest import ingest_http

    ctx = ingest_http.make_context("http", ["--http-port", "9999"])
    assert ctx.params["port"] == 9999
    with pytest.raises(click.NoSuchOption):  # the old alias is gone: a clear refusal
        ingest_http.make_context("http", ["--port", "9999"])


SERVE_THREADS_PROBE = """
import json, sys
import redline.scaling.workers as workers

def probe(settings, count):  # where serve would build the server: numpy loads from here on
    import os, numpy, threadpoolctl
    blas = {i["user_api"]: i["num_threads"] for i in threadpoolctl.threadpool_info()}
    print(json.dumps({**blas, "env": os.environ.get("OPENBLAS_NUM_THREADS")}))
    raise SystemExit(0)

workers.resolve_workers = probe
from redline.cli import main
main(["serve", "--repository", sys.argv[1], "--no-grpc", "--http-port", "0"])
"""


@pytest.mark.parametrize(("operator_set", "expected"), [(None, 1), ("2", 2)])
def test_serve_gives_blas_the_runtime_threads(tmp_path, operator_set, expected) -> None:
    """A retrieval's matrix product must not fan out over every core under load; an operator's
    own OPENBLAS_NUM_THREADS wins."""
    env = {k: v for k, v in os.environ.items() if k not in
           ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    if operator_set:
        env["OPENBLAS_NUM_THREADS"] = operator_set
    out = subprocess.run([sys.executable, "-c", SERVE_THREADS_PROBE, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    # the variable, set before numpy loaded (it can fail on a one-core machine too), and what
    # OpenBLAS made of it (capped at the cores the child may run on, which it inherits from
    # this thread: 2 needs two)
    assert got["env"] == str(expected)
    assert got["blas"] == min(expected, len(os.sched_getaffinity(0))), os.sched_getaffinity(0)
