"""The live window: the last rows a model version saw, in bounded memory."""

from __future__ import annotations

import time

import numpy as np


class RollingWindow:
    """The last ``capacity`` rows of a fixed width, in a ring buffer (bounded memory).

    >>> window = RollingWindow(width=1, capacity=3)
    >>> window.add(np.array([[1.0], [2.0]]))
    >>> window.add(np.array([[3.0], [4.0]]))
    >>> sorted(window.rows()[:, 0].tolist()), window.seen
    ([2.0, 3.0, 4.0], 4)
    """

    def __init__(self, width: int, capacity: int) -> None:
        self.data = np.full((capacity, width), np.nan)
        self.capacity = capacity
        self.pos = 0
        self.size = 0
        self.seen = 0
        self.started = time.time()

    def add(self, rows: np.ndarray) -> None:
        rows = rows[-self.capacity:]
        n = rows.shape[0]
        end = self.pos + n
        if end <= self.capacity:
            self.data[self.pos:end] = rows
        else:
            first = self.capacity - self.pos
            self.data[self.pos:] = rows[:first]
            self.data[: n - first] = rows[first:]
        self.pos = end % self.capacity
        self.size = min(self.capacity, self.size + n)
        self.seen += n

    def rows(self) -> np.ndarray:
        """The rows kept, in ring order (not arrival order once the window has wrapped)."""
        return self.data[: self.size] if self.size < self.capacity else self.data
