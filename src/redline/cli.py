"""The ``redline`` command. Thin: it parses arguments and calls the packages.

Each concern's commands live in ``redline/commands/<concern>.py`` and are imported only when
invoked, so ``redline --help`` stays instant (ONNX Runtime and scikit-learn are slow to import).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from redline import __version__
from redline.errors import RedlineError

# command name -> (module, attribute, one-line help shown in `redline --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "init": (
        "redline.commands.init",
        "init",
        "Create a project (settings, features, data, training script) that serves at once.",
    ),
    "models": (
        "redline.commands.models",
        "models",
        "Manage the model repository (add, list, promote...).",
    ),
    "predict": (
        "redline.commands.predict",
        "predict",
        "Run one local prediction through ONNX Runtime.",
    ),
    "serve": (
        "redline.commands.serve",
        "serve",
        "Serve the repository over HTTP and gRPC (Open Inference Protocol v2).",
    ),
    "bench": (
        "redline.commands.bench",
        "bench",
        "Open-loop load generator with HDR latency reports.",
    ),
    "features": (
        "redline.commands.features",
        "features",
        "Feature definitions: plan, apply, training sets, skew verification.",
    ),
    "ingest": (
        "redline.commands.ingest",
        "ingest",
        "Ingest events into the online store (Redis Streams, HTTP push, file replay).",
    ),
    "rollout": (
        "redline.commands.rollout",
        "rollout",
        "Canary and shadow rollouts of a candidate version, with automatic rollback.",
    ),
    "optimize": (
        "redline.commands.optimize",
        "optimize",
        "Produce faster candidates of a model and register the best one.",
    ),
    "top": (
        "redline.commands.monitoring",
        "top",
        "Live terminal view of a running server: rate, p50/p95/p99 per stage, slow requests.",
    ),
    "drift": (
        "redline.commands.monitoring",
        "drift",
        "Drift of a served model's live inputs against its training profile.",
    ),
    "review": (
        "redline.commands.monitoring",
        "review",
        "Human review queue of edge-case requests: list, label, export.",
    ),
    "gate": (
        "redline.commands.optimize",
        "gate",
        "CI gate: fail when a candidate misses its latency or accuracy bound.",
    ),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attr, _ = entry
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("redline"):
                return None  # command not built yet in this checkout
            raise
        command: click.Command = getattr(module, attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # List commands from the table, without importing them: `redline --help` stays instant.
        rows = [(name, help_text) for name, (_, _, help_text) in sorted(COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="redline")
def cli() -> None:
    """redline: low-latency ML inference — serving, real-time features, optimization.

    \b
    Typical flow:
      redline models add -m fraud model.onnx     # register a model (or convert one)
      redline predict --model fraud --input '[[...]]'
      redline serve                              # HTTP :8000, gRPC :8001
      redline bench --url http://127.0.0.1:8000 --model fraud --rate 500
    """


# Optional dependency (top-level module name) -> the extra that installs it.
EXTRAS: dict[str, str] = {
    "redis": "redis", "hiredis": "redis",
    "sklearn": "convert", "skl2onnx": "convert", "onnxmltools": "convert", "lightgbm": "convert",
    "xgboost": "convert", "joblib": "convert", "onnxconverter_common": "convert",
    "torch": "torch",
    "pyarrow": "offline", "pandas": "offline",
    "httpx": "demo", "tritonclient": "dev",
}


def error_line(code: str, message: str) -> str:
    """The one shape every user error is printed in."""
    return f"error [{code}]: {message}"


def _fail(code: str, message: str) -> None:
    click.echo(error_line(code, message), err=True)
    sys.exit(2)


def _usage_hint(ctx: click.Context | None) -> str:
    if ctx is None:
        return "redline --help"
    return f"{ctx.command_path} --help"


def missing_dependency_message(exc: ModuleNotFoundError) -> str | None:
    """One line naming the extra to install, or None when the module is not an optional one."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return (f"this needs the optional package '{top}', which is not installed; install it with "
            f"pip install 'redline[{extra}]' (or `make demo`, which installs the demo extras)")


def main(argv: list[str] | None = None) -> Any:
    """Entry point: every user error prints one line ``error [code]: message`` and exits 2.

    Click's own usage errors (unknown option, missing argument) are printed the same way. Set
    ``REDLINE_DEBUG=1`` to see the traceback of an unexpected error instead.
    """
    import os

    try:
        return cli.main(args=argv, prog_name="redline", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        _fail("usage", f"{exc.format_message()} (see `{_usage_hint(exc.ctx)}`)")
    except click.ClickException as exc:
        _fail("invalid_input", exc.format_message())
    except RedlineError as exc:
        _fail(exc.code, exc.message)
    except ModuleNotFoundError as exc:
        message = missing_dependency_message(exc)
        if message is None or os.environ.get("REDLINE_DEBUG"):
            raise
        _fail("missing_dependency", message)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        if os.environ.get("REDLINE_DEBUG"):
            raise
        name = f" {exc.filename}" if exc.filename else ""
        _fail("file_error", f"cannot use{name}: {exc.strerror or exc}")


if __name__ == "__main__":
    main()
