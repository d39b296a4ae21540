"""A server started inside someone else's process leaves that process's logging alone: uvicorn's
own logging config (``dictConfig``) would close every handler already there, a test runner's
captured stream or an application's log file included."""

from __future__ import annotations

import io
import logging
from pathlib import Path

from redline.config import Settings
from tests.serving.helpers import ServerThread, make_repository


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Closes its stream when closed, as a file handler (or absl's) does."""

    closed = False

    def close(self) -> None:
        self.closed = True
        self.stream.close()
        super().close()


def test_starting_a_server_closes_no_handler_of_the_process(tmp_path: Path) -> None:
    stream = io.StringIO()
    handler = _Handler(stream)
    logging.getLogger("an.embedding.application").addHandler(handler)
    try:
        settings = Settings()
        settings.server.watch_repository = False
        settings.runtime.warmup_batch_sizes = [1]
        server = ServerThread(settings, make_repository(tmp_path / "models")).start()
        server.stop()
        assert not handler.closed, "the server closed a logging handler it did not own"
        logging.getLogger("an.embedding.application").warning("still writing")
        assert "still writing" in stream.getvalue()
    finally:
        logging.getLogger("an.embedding.application").removeHandler(handler)
