"""The pipes of one AI core as in-order instruction queues (docs/machine.md 2.2, [ACG]).

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


# The busy intervals of a schedule, per pipe, as the timeline's /tasks shows them. A schedule
# has one instruction per tile step and core (millions for a big GEMM); an op's cost keeps at
# most this many intervals per pipe, the run fewer (cmemu run --pipe-intervals).
MAX_INTERVALS_PER_PIPE = 64


def merge_intervals(start, end, max_intervals: int = MAX_INTERVALS_PER_PIPE):
    """(start, end) int64 arrays of the union of the intervals [start, end), sorted, reduced to
    at most ``max_intervals`` by closing the smallest gaps between them (a closed gap counts as
    busy: the merged intervals cover the busy time, and at most the closed gaps besides)."""
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    keep = end > start
    start, end = start[keep], end[keep]
    if start.size == 0:
        return start, end
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    new = np.ones(start.size, dtype=bool)
    new[1:] = start[1:] > reach[:-1]  # touching intervals merge
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, start.size - 1)
    s, e = start[first], reach[last]
    if max_intervals >= 1 and s.size > max_intervals:
        gaps = s[1:] - e[:-1]
        # Keep the max_intervals - 1 largest gaps (ties: the earlier), close the others.
        keep_gap = np.zeros(gaps.size, dtype=bool)
        keep_gap[np.lexsort((np.arange(gaps.size), -gaps))[:max_intervals - 1]] = True
        starts = np.concatenate([[True], keep_gap])
        ends = np.concatenate([keep_gap, [True]])
        s, e = s[starts], e[ends]
    return s, e


@njit(cache=True)
def union_by_position(pipe, start, busy, pipes_per_core, own_pipes):
    """The union of the busy intervals [start, start + busy) of the instructions of each pipe
    position (pipe p < own_pipes is at position p % pipes_per_core; pipes from own_pipes on are
    shared by the die, the HBM, and left out; zero-length instructions too): (position, start,
    end) of the disjoint intervals, sorted by position then start. ``py_func`` is the reference."""
    n = pipe.shape[0]
    # First, per pipe, the runs of instructions that touch or overlap the run so far (a pipe runs
    # its instructions back to back most of the time, so there are far fewer runs than
    # instructions); then sort the runs and merge them per position.
    cur_s = np.full(own_pipes, -1, dtype=np.int64)
    cur_e = np.full(own_pipes, -1, dtype=np.int64)
    run_p = np.empty(n, dtype=np.int64)
    run_s = np.empty(n, dtype=np.int64)
    run_e = np.empty(n, dtype=np.int64)
    m = 0
    for j in range(n):
        q = pipe[j]
        if q >= own_pipes or busy[j] <= 0:
            continue
        s = start[j]
        e = s + busy[j]
        if cur_e[q] >= 0 and cur_s[q] <= s and s <= cur_e[q]:
            if e > cur_e[q]:
                cur_e[q] = e
        else:
            if cur_e[q] >= 0:
                run_p[m] = q
                run_s[m] = cur_s[q]
                run_e[m] = cur_e[q]
                m += 1
            cur_s[q] = s
            cur_e[q] = e
    for q in range(own_pipes):
        if cur_e[q] >= 0:
            run_p[m] = q
            run_s[m] = cur_s[q]
            run_e[m] = cur_e[q]
            m += 1
    span = 1
    for k in range(m):
        if run_s[k] + 1 > span:
            span = run_s[k] + 1
    key = np.empty(m, dtype=np.int64)
    for k in range(m):
        key[k] = (run_p[k] % pipes_per_core) * span + run_s[k]
    order = np.argsort(key, kind="mergesort")
    out_p = np.empty(m, dtype=np.int64)
    out_s = np.empty(m, dtype=np.int64)
    out_e = np.empty(m, dtype=np.int64)
    r = -1
    for i in range(m):
        k = order[i]
        p = run_p[k] % pipes_per_core
        s = run_s[k]
        e = run_e[k]
        if r >= 0 and out_p[r] == p and s <= out_e[r]:
            if e > out_e[r]:
                out_e[r] = e
        else:
            r += 1
            out_p[r] = p
            out_s[r] = s
            out_e[r] = e
    return out_p[:r + 1], out_s[:r + 1], out_e[:r + 1]


def pipe_spans(pipe, start, busy, pipes_per_core: int, own_pipes: int,
               max_intervals: int = MAX_INTERVALS_PER_PIPE, native: bool = True) -> list:
    """Per pipe position p < pipes_per_core (pipe ``c * pipes_per_core + p`` of core or cluster
    c; pipes from ``own_pipes`` on are the die's shared ones, such as the HBM, and left out), the
    busy intervals of all cores' pipe p merged (``merge_intervals``): a list of (start, end)
    cycle arrays, one per position."""
    n = len(pipe)
    fn = union_by_position if native else union_by_position.py_func
    p, s, e = fn(np.asarray(pipe), np.asarray(start[:n], dtype=np.int64), np.asarray(busy[:n], dtype=np.int64),
                 int(pipes_per_core), int(own_pipes))
    bounds = np.searchsorted(p, np.arange(pipes_per_core + 1)).tolist()
    out = []
    for k in range(pipes_per_core):
        a, b = bounds[k], bounds[k + 1]
        if b - a > max_intervals:
            out.append(merge_intervals(s[a:b], e[a:b], max_intervals))
        else:
            out.append((s[a:b], e[a:b]))
    return out


def named_spans(names, spans, max_intervals: int = MAX_INTERVALS_PER_PIPE) -> dict:
    """{name: (start, end)} from per-position spans; positions of one name (the two AIVs of a
    cluster) are merged."""
    out = {}
    for name, (s, e) in zip(names, spans):
        if name in out:
            s, e = merge_intervals(np.concatenate([out[name][0], s]), np.concatenate([out[name][1], e]),
                                   max_intervals)
        out[name] = (s, e)
    return {k: v for k, v in out.items() if v[0].size}
