"""``redline serve``: the repository as an Open Inference Protocol v2 service (REST + gRPC)."""

from __future__ import annotations

import logging

import click

from redline.config import load_settings


@click.command("serve")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="redline.yaml to read (default: ./redline.yaml if present).")
@click.option("--repository", "-r", type=click.Path(file_okay=False), default=None,
              help="Model repository folder (overrides `repository:` in the config).")
@click.option("--host", default=None, help="Address to bind (default 127.0.0.1).")
@click.option("--http-port", type=int, default=None, help="REST port (default 8000; 0 = any).")
@click.option("--grpc-port", type=int, default=None, help="gRPC port (default 8001; 0 = any).")
@click.option("--no-grpc", is_flag=True, help="Serve REST only.")
@click.option("--no-watch", is_flag=True, help="Do not poll the repository for new versions.")
@click.option("--admin-token", envvar="REDLINE_ADMIN_TOKEN", default=None,
              help="Enable the admin API (load/unload/index) behind this bearer token.")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def serve(config_path: str | None, repository: str | None, host: str | None,
          http_port: int | None, grpc_port: int | None, no_grpc: bool, no_watch: bool,
          admin_token: str | None, log_level: str) -> None:
    """Serve every model in the repository over HTTP and gRPC until SIGTERM (then drain)."""
    settings = load_settings(config_path)
    server = settings.server
    if repository is not None:
        settings.repository = repository
    if host is not None:
        server.host = host
    if http_port is not None:
        server.http_port = http_port
    if grpc_port is not None:
        server.grpc_port = grpc_port
    if no_grpc:
        server.grpc_enabled = False
    if no_watch:
        server.watch_repository = False
    if admin_token:
        server.admin_enabled = True
        server.admin_token = admin_token
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    from redline.serving.server import run

    run(settings)
