"""redline: a low-latency ML inference pipeline."""

__version__ = "0.1.0"
