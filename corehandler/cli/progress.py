"""A progress bar on stderr for long copies (`dump`, `fleet get` of multi-GiB cores), on a terminal only:
piped or redirected output stays free of it. Redrawn at most ten times a second."""

from __future__ import annotations

import sys
import time

from corehandler.units import human_size

_WIDTH = 30


class Progress:
    """Call it with each chunk's length; close() ends the line. Does nothing when stderr is no terminal."""

    def __init__(self, total: int | None, label: str, stream=None, *, enabled: bool | None = None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total, self.label, self.done = total, label, 0
        self._started = self._drawn = time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self._drawn >= 0.1:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.done / max(now - self._started, 1e-6)
        if self.total:
            share = min(1.0, self.done / self.total)
            bar = "#" * int(share * _WIDTH)
            text = f"{self.label} [{bar:<{_WIDTH}}] {share:4.0%} {human_size(self.done)}/{human_size(self.total)}"
        else:
            text = f"{self.label} {human_size(self.done)}"
        self.stream.write(f"\r{text} {human_size(int(rate))}/s\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
