"""Tile schedules built from a per-block template (attention blocks, vector-op chunks).

Many kernels repeat one block of work: the same instructions on the same pipes, block after
block, each block on some cluster of cores (1 AIC + 2 AIV for attention, one AIV for a vector
op). A :class:`Template` lists one block's instructions; a dependency names another instruction
of the same block (``back = 0``) or of the block ``back`` blocks earlier on the same cluster
(``back = 1, 2``: the buffer-slot releases of double buffering). ``expand`` instantiates the
template for every block, with per-block busy times and latencies for the instructions that
vary (a hit or a miss, a shorter last block, work only in a unit's first block), into a program
for ``pipeline.run_program``.

``expand`` is a Numba kernel; ``expand.py_func`` its pure-Python reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from cmemu.kernels import njit

MAX_BACK = 2


@dataclass
class Template:
    """One block's instructions. Pipes ``0 .. pipes_per_cluster - 1`` belong to the block's
    cluster; pipe ``pipes_per_cluster + i`` is shared pipe ``i`` of the die (the HBM)."""

    pipes_per_cluster: int
    shared_pipes: int = 0
    pipe: list = field(default_factory=list)
    busy: list = field(default_factory=list)
    lat: list = field(default_factory=list)
    var: list = field(default_factory=list)  # index of the per-block column, or -1
    deps: list = field(default_factory=list)  # [(template index, back)]
    names: list = field(default_factory=list)
    n_var: int = 0

    def add(self, pipe: int, busy: int = 0, lat: int = 0, deps=(), name: str = "", variable: bool = False) -> int:
        """One instruction; ``variable`` gives it a per-block busy/lat column (its index is
        ``self.var[i]``). Returns its template index."""
        self.pipe.append(pipe)
        self.busy.append(int(busy))
        self.lat.append(int(lat))
        v = -1
        if variable:
            v = self.n_var
            self.n_var += 1
        self.var.append(v)
        fixed = []
        for d in deps:
            src, back = (d, 0) if isinstance(d, (int, np.integer)) else d
            if src is None or src < 0:
                continue
            if not 0 <= back <= MAX_BACK:
                raise ValueError(f"a dependency may reach at most {MAX_BACK} blocks back")
            if back == 0 and src >= len(self.pipe) - 1:
                raise ValueError("a dependency inside a block must name an earlier instruction")
            fixed.append((int(src), int(back)))
        self.deps.append(fixed)
        self.names.append(name)
        return len(self.pipe) - 1

    def arrays(self):
        ptr = np.zeros(len(self.pipe) + 1, dtype=np.int64)
        np.cumsum([len(d) for d in self.deps], out=ptr[1:])
        src = np.array([s for ds in self.deps for s, _ in ds], dtype=np.int64)
        back = np.array([b for ds in self.deps for _, b in ds], dtype=np.int64)
        return (np.asarray(self.pipe, dtype=np.int32), np.asarray(self.busy, dtype=np.int64),
                np.asarray(self.lat, dtype=np.int64), np.asarray(self.var, dtype=np.int64), ptr, src, back)


@njit(cache=True)
def expand(t_pipe, t_busy, t_lat, t_var, t_ptr, t_src, t_back, pipes_per_cluster,
           block_cluster, var_busy, var_lat, n_clusters):
    """The program of all blocks (in the order given; block i runs on block_cluster[i]).

    var_busy/var_lat: int64[blocks, n_var] for the template's variable instructions.
    Returns (pipe, busy, lat, dep_ptr, dep_idx) for run_program (with n_clusters x
    pipes_per_cluster + shared pipes).
    """
    nt = t_pipe.shape[0]
    nb = block_cluster.shape[0]
    n = nt * nb
    nd = t_src.shape[0] * nb
    pipe = np.empty(n, dtype=np.int32)
    busy = np.empty(n, dtype=np.int64)
    lat = np.empty(n, dtype=np.int64)
    dep_ptr = np.zeros(n + 1, dtype=np.int64)
    dep_idx = np.empty(nd, dtype=np.int64)
    hist = np.full((n_clusters, 3), -1, dtype=np.int64)  # first instruction of blocks 0, 1, 2 back
    e = 0
    for b in range(nb):
        c = block_cluster[b]
        base = b * nt
        hist[c, 2] = hist[c, 1]
        hist[c, 1] = hist[c, 0]
        hist[c, 0] = base
        for i in range(nt):
            j = base + i
            tp = t_pipe[i]
            if tp < pipes_per_cluster:
                pipe[j] = c * pipes_per_cluster + tp
            else:  # a pipe shared by all clusters, after theirs
                pipe[j] = n_clusters * pipes_per_cluster + tp - pipes_per_cluster
            v = t_var[i]
            if v >= 0:
                busy[j] = var_busy[b, v]
                lat[j] = var_lat[b, v]
            else:
                busy[j] = t_busy[i]
                lat[j] = t_lat[i]
            for q in range(t_ptr[i], t_ptr[i + 1]):
                h = hist[c, t_back[q]]
                if h >= 0:
                    dep_idx[e] = h + t_src[q]
                    e += 1
            dep_ptr[j + 1] = e
    return pipe, busy, lat, dep_ptr, dep_idx[:e]


@njit(cache=True)
def expand_interleaved(t_pipe, t_busy, t_lat, t_var, t_ptr, t_src, t_back, pipes_per_cluster,
                       block_cluster, block_round, var_busy, var_lat, n_clusters):
    """As ``expand``, but the blocks come in rounds (``block_round``, non-decreasing: each
    cluster's k-th block is in round k) and a round is listed instruction by instruction:
    template instruction i of every block of the round, then instruction i + 1. Each cluster's
    pipes keep their order and every dependency still points back; a shared pipe (the HBM) then
    serves the clusters' requests interleaved as they come, not one block's all before the next
    block's first."""
    nt = t_pipe.shape[0]
    nb = block_cluster.shape[0]
    n = nt * nb
    nd = t_src.shape[0] * nb
    pipe = np.empty(n, dtype=np.int32)
    busy = np.empty(n, dtype=np.int64)
    lat = np.empty(n, dtype=np.int64)
    dep_ptr = np.zeros(n + 1, dtype=np.int64)
    dep_idx = np.empty(nd, dtype=np.int64)
    # Program index of (block b, template instruction i): at[b] + i * step[b], where a round of
    # step blocks starting at block f lists its instruction i from f * nt + i * step on.
    at = np.empty(nb, dtype=np.int64)
    step = np.empty(nb, dtype=np.int64)
    a = 0
    while a < nb:
        z = a
        while z < nb and block_round[z] == block_round[a]:
            z += 1
        for b in range(a, z):
            at[b] = a * nt + (b - a)
            step[b] = z - a
        a = z
    hist = np.full((n_clusters, 3), -1, dtype=np.int64)  # blocks 0, 1, 2 back on each cluster
    prev = np.full((nb, 3), -1, dtype=np.int64)
    for b in range(nb):
        c = block_cluster[b]
        hist[c, 2] = hist[c, 1]
        hist[c, 1] = hist[c, 0]
        hist[c, 0] = b
        prev[b, 0] = b
        prev[b, 1] = hist[c, 1]
        prev[b, 2] = hist[c, 2]
    e = 0
    j = 0
    a = 0
    while a < nb:
        z = a + step[a]
        for i in range(nt):
            tp = t_pipe[i]
            v = t_var[i]
            q0 = t_ptr[i]
            q1 = t_ptr[i + 1]
            for b in range(a, z):
                c = block_cluster[b]
                if tp < pipes_per_cluster:
                    pipe[j] = c * pipes_per_cluster + tp
                else:
                    pipe[j] = n_clusters * pipes_per_cluster + tp - pipes_per_cluster
                if v >= 0:
                    busy[j] = var_busy[b, v]
                    lat[j] = var_lat[b, v]
                else:
                    busy[j] = t_busy[i]
                    lat[j] = t_lat[i]
                for q in range(q0, q1):
                    h = prev[b, t_back[q]]
                    if h >= 0:
                        dep_idx[e] = at[h] + t_src[q] * step[h]
                        e += 1
                dep_ptr[j + 1] = e
                j += 1
        a = z
    return pipe, busy, lat, dep_ptr, dep_idx[:e]
