"""redline: a low-latency ML inference pipeline."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``redline.Client`` / ``redline.AsyncClient`` without importing them for every CLI call."""
    if name in ("Client", "AsyncClient"):
        from redline.scaling import client

        return getattr(client, name)
    raise AttributeError(f"module 'redline' has no attribute {name!r}")
