"""Drift thresholds kept beside the model version they belong to.

Calibrating a version's thresholds costs seconds of CPU (thousands of reference-drawn windows per
feature and window size) and its result is a pure function of the version's input profile, the
window capacity and the calibration's constants. So it is computed once per version, by the
first server that needs it, and written as ``drift_thresholds.json`` into the version's folder;
every later worker, replica or restart reads it in milliseconds. The file names what it was
computed from (a fingerprint); a file for other inputs, or an unreadable one, is ignored and
computed again. A repository that cannot be written (a read-only mount) only costs each process
its own calibration.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("redline.monitoring")

FILE_NAME = "drift_thresholds.json"
FORMAT = 1


def fingerprint(profile: dict[str, Any], names: list[str], capacity: int,
                constants: dict[str, float]) -> str:
    """What the thresholds are a function of, as one hash."""
    doc = {"format": FORMAT, "profile": profile, "names": names, "capacity": capacity,
           "constants": constants}
    text = json.dumps(doc, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class ThresholdFile:
    """``<repository>/<model>/<version>/drift_thresholds.json`` for one fingerprint."""

    def __init__(self, folder: Path, key: str) -> None:
        self.path = Path(folder) / FILE_NAME
        self.key = key

    def load(self) -> dict[str, Any] | None:
        """The stored thresholds per feature, or None when absent, stale or unreadable."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s (%s): the thresholds are calibrated again", self.path, exc)
            return None
        if not isinstance(doc, dict) or doc.get("fingerprint") != self.key:
            return None
        features = doc.get("features")
        return features if isinstance(features, dict) else None

    def save(self, features: dict[str, Any]) -> None:
        """Write atomically (a reader never sees half a file); a failure is only logged."""
        doc = {"fingerprint": self.key, "features": features}
        tmp: str | None = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-thresholds-")
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            os.chmod(tmp, 0o644)  # readable by every server, as the model file is
            os.replace(tmp, self.path)
            tmp = None
        except OSError as exc:
            log.info("drift thresholds not kept beside the version (%s: %s); each server "
                     "calibrates them itself", self.path.parent, exc.strerror or exc)
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
