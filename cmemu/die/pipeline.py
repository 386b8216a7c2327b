"""The pipes of one AI core as in-order instruction queues (SPEC.md 2.2, [ACG]).

An AIC has the pipes MTE2 (GM->L1), MTE1 (L1->L0A/L0B), CUBE and FIXP (L0C->GM); an AIV has
MTE2 (GM->UB), VECTOR and MTE3 (UB->GM). Each pipe executes its instructions in program order,
one at a time, as the hardware queues do; pipes run in parallel and wait on each other only
through flags (SetFlag/WaitFlag), written here as dependencies between instructions.

An instruction occupies its pipe for ``busy`` cycles (its start-up cost plus bytes / rate) and
its result is usable ``lat`` cycles after that (a memory read's latency: the pipe already issues
the next transfer while the data is in flight). Double buffering is nothing special: it is the
dependency of the producer of buffer slot ``i`` on the consumer of slot ``i - depth``.

A *program* is a list of instructions in an order where every dependency points backwards and
each pipe's instructions appear in its program order. Several cores are one program with
``pipe = core * pipes_per_core + p``. ``run_program_into`` is the Numba kernel;
``run_program_into.py_func`` is its pure-Python reference (the same source run by the
interpreter), which tests compare; ``run_program(..., native=False)`` picks it.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def run_program_into(pipe, busy, lat, dep_ptr, dep_idx, n_pipes, start, finish):
    """Start and finish cycle of every instruction (written into ``start``, ``finish``), and
    each pipe's busy cycles (returned).

    pipe int32[n], busy int64[n], lat int64[n]; dep_ptr int64[n+1] and dep_idx int64[...] (CSR:
    the instructions each one waits for, all earlier in the list); n_pipes: pipes in all;
    start, finish: int64 arrays of at least n entries.
    """
    n = pipe.shape[0]
    free = np.zeros(n_pipes, dtype=np.int64)
    pipe_busy = np.zeros(n_pipes, dtype=np.int64)
    for j in range(n):
        p = pipe[j]
        t = free[p]
        for q in range(dep_ptr[j], dep_ptr[j + 1]):
            f = finish[dep_idx[q]]
            if f > t:
                t = f
        start[j] = t
        if busy[j] > 0:  # a zero-cost instruction only synchronises: it does not hold its pipe
            free[p] = t + busy[j]
        finish[j] = t + busy[j] + lat[j]
        pipe_busy[p] += busy[j]
    return pipe_busy


def run_program(pipe, busy, lat, dep_ptr, dep_idx, n_pipes, native: bool = True, scratch=None):
    """(start, finish, pipe_busy) of a program; ``native=False`` runs the pure-Python reference.

    ``scratch``: a :class:`Scratch` whose buffers hold start and finish (the returned arrays are
    then views into it, valid until its next use): big schedules then reuse memory instead of
    faulting in fresh pages on every call.
    """
    n = len(pipe)
    if scratch is None:
        start, finish = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    else:
        start, finish = scratch.get("start", n), scratch.get("finish", n)
    fn = run_program_into if native else run_program_into.py_func
    busy_out = fn(pipe, busy, lat, dep_ptr, dep_idx, n_pipes, start, finish)
    return start[:n], finish[:n], busy_out


class Scratch:
    """Named int64/int32 buffers that grow as needed and are reused across calls."""

    def __init__(self):
        self._bufs = {}

    def get(self, name: str, n: int, dtype=np.int64) -> np.ndarray:
        buf = self._bufs.get(name)
        if buf is None or buf.shape[0] < n or buf.dtype != dtype:
            buf = self._bufs[name] = np.empty(max(n, 1), dtype=dtype)
        return buf


class Program:
    """A growing instruction list (for builders written in Python: vector ops, MLA, tests)."""

    def __init__(self, pipes_per_core: int):
        self.pipes_per_core = pipes_per_core
        self.pipe: list[int] = []
        self.busy: list[int] = []
        self.lat: list[int] = []
        self.deps: list[tuple[int, ...]] = []

    def add(self, core: int, pipe: int, busy: int, lat: int = 0, deps=()) -> int:
        """Append one instruction; returns its index (to name it in later dependencies)."""
        self.pipe.append(core * self.pipes_per_core + pipe)
        self.busy.append(int(busy))
        self.lat.append(int(lat))
        self.deps.append(tuple(d for d in deps if d is not None and d >= 0))
        return len(self.pipe) - 1

    def arrays(self):
        n = len(self.pipe)
        dep_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(d) for d in self.deps], out=dep_ptr[1:])
        dep_idx = np.fromiter((d for ds in self.deps for d in ds), dtype=np.int64, count=int(dep_ptr[-1]))
        return (np.asarray(self.pipe, dtype=np.int32), np.asarray(self.busy, dtype=np.int64),
                np.asarray(self.lat, dtype=np.int64), dep_ptr, dep_idx)

    def run(self, cores: int, native: bool = True):
        """(start, finish, pipe_busy[cores, pipes_per_core]) of the program."""
        n_pipes = cores * self.pipes_per_core
        start, finish, busy = run_program(*self.arrays(), n_pipes, native=native)
        return start, finish, np.asarray(busy).reshape(cores, self.pipes_per_core)
