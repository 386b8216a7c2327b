"""cmemu's Numba kernels: how they are compiled, and the time that takes.

Every kernel is ``njit(cache=True)``, with this module's ``njit`` (Numba's, imported on the first
kernel's definition, so that importing this module costs nothing):
Numba compiles it on its first call with a new signature and keeps the machine code in the
``__pycache__`` folder beside its source, keyed by the source's content, Numba's version, the
Python version and the CPU. ``pip install .`` compiles the kernels the README's main command
uses as it builds (setup.py, ``warm_up``), so that the first run finds them; a kernel, a
signature or a machine the build did not see is compiled on first use, once.

Numba's ``numba:compile`` events are watched from the first kernel's definition: the compile
time so far (``compile_seconds``), which a run keeps out of its events/s figure, and one line to
the user the first time anything compiles in a process (``tell_compiles``: the command line's).
"""
from __future__ import annotations

import threading
import time

COMPILE_NOTICE = "cmemu: compiling kernels (first run only: Numba keeps them) ..."


class _Compiles:
    """Wall time in Numba's compiler, counted once however deep compiles nest."""

    def __init__(self):
        self.lock = threading.Lock()
        self.depth = 0
        self.since = 0.0
        self.total_s = 0.0
        self.tell = None  # called once, at the first compile
        self.told = False

    def on_start(self, event):
        with self.lock:
            if self.depth == 0:
                self.since = time.perf_counter()
                if self.tell is not None and not self.told:
                    self.told = True
                    self.tell()
            self.depth += 1

    def on_end(self, event):
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                self.total_s += time.perf_counter() - self.since


_COMPILES = _Compiles()
_WATCHING = []


def njit(*args, **options):
    """numba.njit, with the compiles watched (module docstring)."""
    import numba

    if not _WATCHING:
        from numba.core import event

        class Listener(event.Listener):
            def on_start(self, e):
                _COMPILES.on_start(e)

            def on_end(self, e):
                _COMPILES.on_end(e)

        event.register("numba:compile", Listener())
        _WATCHING.append(True)
    return numba.njit(*args, **options)


def compile_seconds() -> float:
    """Seconds this process has spent compiling kernels so far (a compile under way included)."""
    with _COMPILES.lock:
        running = time.perf_counter() - _COMPILES.since if _COMPILES.depth else 0.0
        return _COMPILES.total_s + running


def tell_compiles(tell) -> None:
    """Call ``tell()`` once, when a kernel is first compiled in this process (not for cached ones)."""
    _COMPILES.tell = tell
