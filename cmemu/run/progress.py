"""The one-line progress report of a long run, on stderr."""
from __future__ import annotations

import sys
import time


PROGRESS_AFTER_S = 2.0


class Progress:
    """A one-line progress report on stderr, shown only once a run has taken a while."""

    def __init__(self, total_ops: int, stream=None, after_s: float = PROGRESS_AFTER_S):
        self.total = total_ops
        self.stream = stream if stream is not None else sys.stderr
        self.after_s = after_s
        self.t0 = time.perf_counter()
        self.shown = False

    def update(self, engine) -> None:
        elapsed = time.perf_counter() - self.t0
        if elapsed < self.after_s:
            return
        self.shown = True
        pct = 100.0 * engine.ops_done / self.total if self.total else 100.0
        rate = engine.events / elapsed / 1e6
        self.stream.write(
            f"\r  simulated {engine.now / 1e6:,.3f} us | ops {engine.ops_done:,}/{self.total:,} "
            f"({pct:.0f}%) | {engine.events:,} events | {rate:.2f} M events/s | {elapsed:.1f} s wall"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
