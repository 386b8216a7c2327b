"""GEMM and grouped GEMM on the AICs of one die, as a tile schedule on the pipes.

C[g] = A[g] (M x K) @ B[g] (K x N) for g < groups; inputs bf16/fp16 or int8, output bf16
(int8 accumulates in int32, bf16 in fp32: 4 B per element in L0C either way).

Tiling, from the buffer capacities (docs/machine.md 2.2), as CANN's matmul does it:
- the output is cut into base tiles tile_m x tile_n (default 128 x 152, docs/machine.md 3); base tiles
  go round-robin to the cores, wave after wave, in row-major order within each group;
- the cube works on 16 x k x 16 fractals, so a tile's rows and columns are padded to 16 and its
  depth steps to the cube's k granule (16 bf16, 32 int8): padding costs cube cycles;
- L0A/L0B hold two k-steps (double buffering): the step depth ``bk`` is the largest multiple of
  the k granule for which 2 x tile_m x bk and 2 x bk x tile_n fit;
- L1 holds two chunks of A and B (double buffering): the chunk depth ``kl1`` is the largest
  multiple of ``bk`` for which 2 x (tile_m + tile_n) x kl1 fits;
- L0C holds as many accumulators (up to 2) as fit; with one, the cube waits for FixPipe to
  drain the tile before the next tile starts.

Per tile and chunk: MTE2 loads the A chunk and the B chunk from L2 (on a miss the die's HBM, one
pipe shared by all cores, first fetches it into L2); per k-step MTE1 moves the fractals to
L0A/L0B and the cube runs one mmad; after the last chunk FixPipe writes the tile to GM. L2 hits
come from an LRU over the chunks in wave order (l2.py).

``gemm_accesses`` and ``gemm_program`` are Numba kernels; their ``py_func`` are the references.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from cmemu.die.l2 import lru_run
from cmemu.die.model import AIC_PIPES, DTYPE_BYTES, DieModel, OpCost, ceil_div, check_size, cost_params, finish_cost
from cmemu.die.pipeline import Scratch, named_spans, pipe_spans, run_program

# Indices into the cost table (cmemu.die.model.cost_params).
(P_MTE2_START, P_MTE1_START, P_CUBE_START, P_FIX_START, P_MTE1_A_RATE, P_MTE1_B_RATE, P_FIX_RATE,
 P_L2_LAT, P_HBM_RD_LAT, P_WR_LAT, P_MTE2_RATE_MILLI, P_HBM_RATE_MILLI) = range(12)
MTE2, MTE1, CUBE, FIXP = range(4)
ACC_BYTES = 4  # fp32 / int32 accumulators in L0C


@dataclass(frozen=True)
class GemmTiling:
    groups: int
    m: int
    n: int
    k: int
    tile_m: int
    tile_n: int
    bk: int
    kl1: int
    in_byte: int
    out_byte: int
    k_granule: int
    accumulators: int

    @property
    def m_tiles(self) -> int:
        return ceil_div(self.m, self.tile_m)

    @property
    def n_tiles(self) -> int:
        return ceil_div(self.n, self.tile_n)

    @property
    def tiles(self) -> int:
        return self.groups * self.m_tiles * self.n_tiles

    @property
    def chunks(self) -> int:
        return ceil_div(self.k, self.kl1)

    def as_array(self) -> np.ndarray:
        return np.array([self.groups, self.m, self.n, self.k, self.tile_m, self.tile_n, self.bk, self.kl1,
                         self.in_byte, self.out_byte, self.k_granule, self.accumulators], dtype=np.int64)


def plan(model: DieModel, m: int, n: int, k: int, groups: int = 1, dtype: str = "bf16",
         tile_m: int = 128, tile_n: int = 152, out_dtype: str = "bf16") -> GemmTiling:
    """Choose the step and chunk depths that the buffers allow (raises if the tile cannot fit)."""
    d = model.die
    for name, v in (("m", m), ("n", n), ("k", k), ("groups", groups), ("tile_m", tile_m), ("tile_n", tile_n)):
        if v <= 0:
            raise ValueError(f"GEMM {name} must be > 0, got {v}")
    kg = model.k_granule(dtype)
    ib = DTYPE_BYTES[dtype]
    pm, pn = ceil_div(tile_m, 16) * 16, ceil_div(tile_n, 16) * 16
    acc = (d.l0c_buffer_kib << 10) // (pm * pn * ACC_BYTES)
    if acc < 1:
        raise ValueError(f"a {tile_m} x {tile_n} tile's accumulators ({pm * pn * ACC_BYTES} B) do not fit "
                         f"L0C ({d.l0c_buffer_kib} KiB)")
    bk_a = (d.l0a_buffer_kib << 10) // (2 * pm * ib)
    bk_b = (d.l0b_buffer_kib << 10) // (2 * pn * ib)
    bk = min(bk_a, bk_b) // kg * kg
    if bk < kg:
        raise ValueError(f"a {tile_m} x {tile_n} tile leaves no room for a double-buffered k-step in L0A/L0B")
    bk = min(bk, ceil_div(k, kg) * kg)
    kl1 = (d.l1_buffer_kib << 10) // (2 * (tile_m + tile_n) * ib) // bk * bk
    if kl1 < bk:
        raise ValueError(f"a {tile_m} x {tile_n} tile leaves no room for double-buffered chunks in L1")
    kl1 = min(kl1, ceil_div(k, bk) * bk)
    return GemmTiling(groups, m, n, k, tile_m, tile_n, bk, kl1, ib, DTYPE_BYTES[out_dtype], kg, min(acc, 2))


@njit(cache=True)
def gemm_accesses(t, cores):
    """The L2 accesses of the schedule in wave order: for each wave, chunk and core, the A chunk
    then the B chunk; after a tile's last chunk, its output. Returns (object id, bytes)."""
    groups, m, n, k, tm, tn, bk, kl1, ib, ob = t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9]
    mt = (m + tm - 1) // tm
    nt = (n + tn - 1) // tn
    nq = (k + kl1 - 1) // kl1
    tiles = groups * mt * nt
    waves = (tiles + cores - 1) // cores
    n_acc = tiles * (2 * nq + 1)
    obj = np.empty(n_acc, dtype=np.int64)
    nbytes = np.empty(n_acc, dtype=np.int64)
    b_base = groups * mt * nq
    c_base = b_base + groups * nt * nq
    i = 0
    for w in range(waves):
        for q in range(nq):
            klen = min(kl1, k - q * kl1)
            for c in range(cores):
                tile = w * cores + c
                if tile >= tiles:
                    break
                g = tile // (mt * nt)
                mi = (tile // nt) % mt
                ni = tile % nt
                mlen = min(tm, m - mi * tm)
                nlen = min(tn, n - ni * tn)
                obj[i] = (g * mt + mi) * nq + q
                nbytes[i] = mlen * klen * ib
                obj[i + 1] = b_base + (g * nt + ni) * nq + q
                nbytes[i + 1] = klen * nlen * ib
                i += 2
                if q == nq - 1:
                    obj[i] = c_base + tile
                    nbytes[i] = mlen * nlen * ob
                    i += 1
    return obj[:i], nbytes[:i], c_base + tiles


@njit(cache=True)
def gemm_program(t, cores, hits, cp, pipe, busy, lat, dep_ptr, dep_idx):
    """The instruction program of the schedule (see pipeline.run_program), in wave order.

    t: tiling table (GemmTiling.as_array), hits: L2 hit flag of each access of gemm_accesses
    (same order), cp: cost table; pipe, busy, lat, dep_ptr, dep_idx: buffers of at least
    gemm_instructions(t) entries (dep_idx: 3 x, dep_ptr: + 1), filled here. Returns (instructions,
    dependencies, macs, hit bytes, miss bytes, write bytes).
    """
    groups, m, n, k, tm, tn, bk, kl1, ib, ob, kg, nacc = (t[0], t[1], t[2], t[3], t[4], t[5], t[6],
                                                          t[7], t[8], t[9], t[10], t[11])
    mt = (m + tm - 1) // tm
    nt = (n + tn - 1) // tn
    nq = (k + kl1 - 1) // kl1
    tiles = groups * mt * nt
    waves = (tiles + cores - 1) // cores
    dep_ptr[0] = 0
    l1_free = np.full((cores, 2), -1, dtype=np.int64)  # last MTE1 reading each L1 slot
    l0_free = np.full((cores, 2), -1, dtype=np.int64)  # last cube reading each L0A/L0B slot
    l0c_free = np.full((cores, 2), -1, dtype=np.int64)  # FixPipe draining each accumulator
    step_no = np.zeros(cores, dtype=np.int64)
    tile_no = np.zeros(cores, dtype=np.int64)
    last_cube = np.full(cores, -1, dtype=np.int64)
    b_base = groups * mt * nq
    fetched = np.full(b_base + groups * nt * nq, -1, dtype=np.int64)  # step of each chunk's last miss
    loads = np.empty(2, dtype=np.int64)  # this chunk's A and B loads
    fetch_ins = np.full(b_base + groups * nt * nq, -1, dtype=np.int64)  # its HBM fetch instruction
    hbm_pipe = cores * 4  # one HBM server shared by all cores
    j = 0
    e = 0
    a = 0  # index into hits
    macs = 0
    hit_b = 0
    miss_b = 0
    write_b = 0
    for w in range(waves):
        for q in range(nq):
            klen = min(kl1, k - q * kl1)
            for c in range(cores):
                tile = w * cores + c
                if tile >= tiles:
                    break
                g = tile // (mt * nt)
                mi = (tile // nt) % mt
                ni = tile % nt
                mlen = min(tm, m - mi * tm)
                nlen = min(tn, n - ni * tn)
                base = c * 4
                slot = q % 2
                step = w * nq + q
                for s in range(2):  # the A chunk, then the B chunk
                    nb = mlen * klen * ib if s == 0 else klen * nlen * ib
                    o = (g * mt + mi) * nq + q if s == 0 else b_base + (g * nt + ni) * nq + q
                    wait = -1
                    if not hits[a]:
                        # A miss: the HBM (one server for the die, at its achieved rate) fetches
                        # the chunk into L2 once the core asks for it; MTE2 copies it from there.
                        fetched[o] = step
                        miss_b += nb
                        pipe[j] = hbm_pipe
                        busy[j] = (nb * 1000 + cp[11] - 1) // cp[11]
                        lat[j] = cp[8]
                        if l1_free[c, slot] >= 0:
                            dep_idx[e] = l1_free[c, slot]
                            e += 1
                        dep_ptr[j + 1] = e
                        fetch_ins[o] = j
                        wait = j
                        j += 1
                    else:
                        hit_b += nb
                        if fetched[o] == step:
                            # Another core's miss on the same chunk is in flight: this core
                            # waits for the same fetch (a merged miss).
                            wait = fetch_ins[o]
                    rate = cp[10]
                    lat[j] = cp[7]
                    if wait >= 0:
                        dep_idx[e] = wait
                        e += 1
                    a += 1
                    pipe[j] = base + 0
                    busy[j] = cp[0] + (nb * 1000 + rate - 1) // rate
                    if l1_free[c, slot] >= 0:
                        dep_idx[e] = l1_free[c, slot]
                        e += 1
                    dep_ptr[j + 1] = e
                    loads[s] = j
                    j += 1
                nsteps = (klen + bk - 1) // bk
                for s in range(nsteps):
                    kk = min(bk, klen - s * bk)
                    kpad = (kk + kg - 1) // kg * kg
                    mpad = (mlen + 15) // 16 * 16
                    npad = (nlen + 15) // 16 * 16
                    # MTE1: the A fractals to L0A and the B fractals to L0B.
                    pipe[j] = base + 1
                    lat[j] = 0
                    busy[j] = (2 * cp[1] + (mpad * kpad * ib + cp[4] - 1) // cp[4]
                               + (kpad * npad * ib + cp[5] - 1) // cp[5])
                    dep_idx[e] = loads[0]
                    dep_idx[e + 1] = loads[1]
                    e += 2
                    ls = step_no[c] % 2
                    if l0_free[c, ls] >= 0:
                        dep_idx[e] = l0_free[c, ls]
                        e += 1
                    dep_ptr[j + 1] = e
                    mte1 = j
                    j += 1
                    # Cube: one mmad of (mpad/16) x (npad/16) x (kpad/kg) fractal steps.
                    pipe[j] = base + 2
                    lat[j] = 0
                    busy[j] = cp[2] + (mpad // 16) * (npad // 16) * (kpad // kg)
                    dep_idx[e] = mte1
                    e += 1
                    if q == 0 and s == 0:
                        acc = tile_no[c] % nacc
                        if l0c_free[c, acc] >= 0:
                            dep_idx[e] = l0c_free[c, acc]
                            e += 1
                    dep_ptr[j + 1] = e
                    l0_free[c, ls] = j
                    last_cube[c] = j
                    macs += mlen * nlen * kk
                    step_no[c] += 1
                    j += 1
                l1_free[c, slot] = mte1
                if q == nq - 1:
                    # FixPipe: the tile's accumulators (L0C bytes) out to GM, through L2.
                    a += 1  # the output's own L2 access (write-allocate)
                    write_b += mlen * nlen * ob
                    mpad = (mlen + 15) // 16 * 16
                    npad = (nlen + 15) // 16 * 16
                    pipe[j] = base + 3
                    busy[j] = cp[3] + (mpad * npad * ACC_BYTES + cp[6] - 1) // cp[6]
                    lat[j] = cp[9]
                    dep_idx[e] = last_cube[c]
                    e += 1
                    dep_ptr[j + 1] = e
                    l0c_free[c, tile_no[c] % nacc] = j
                    tile_no[c] += 1
                    j += 1
    return j, e, macs, hit_b, miss_b, write_b


def gemm_instructions(t: GemmTiling) -> int:
    """Instructions of the schedule (at most): per tile and chunk two MTE2 loads and two HBM
    fetches, per k-step an MTE1 and a cube instruction, per tile one FixPipe."""
    # Every chunk but the last is kl1 deep (a multiple of bk); worked out without a loop over the
    # chunks, so that a huge k costs nothing before check_size refuses it.
    steps = (t.chunks - 1) * (t.kl1 // t.bk) + ceil_div(t.k - (t.chunks - 1) * t.kl1, t.bk)
    return t.tiles * (4 * t.chunks + 2 * steps + 1)


# Buffers reused by every schedule evaluation (a big schedule would otherwise fault in tens of
# MB of fresh pages per call).
_SCRATCH = Scratch()


def gemm_cost(model: DieModel, m: int, n: int, k: int, groups: int = 1, dtype: str = "bf16",
              cores: int | None = None, tile_m: int = 128, tile_n: int = 152, native: bool = True,
              op: str = "grouped_gemm") -> OpCost:
    """Time a (grouped) GEMM on ``cores`` AICs of the die (all by default)."""
    d = model.die
    cores = d.aic_cores if cores is None else cores
    if not 1 <= cores <= d.aic_cores:
        raise ValueError(f"{cores} AIC requested, the die has {d.aic_cores}")
    t = plan(model, m, n, k, groups, dtype, tile_m, tile_n)
    n_ins = gemm_instructions(t)
    check_size(f"a {groups} x {m} x {n} x {k} GEMM", n_ins)
    ta = t.as_array()
    acc = gemm_accesses if native else gemm_accesses.py_func
    lru = lru_run if native else lru_run.py_func
    prog = gemm_program if native else gemm_program.py_func
    obj, nbytes, n_obj = acc(ta, cores)
    hits = lru(obj, nbytes, model.l2_capacity_byte, n_obj)
    bufs = (_SCRATCH.get("pipe", n_ins, np.int32), _SCRATCH.get("busy", n_ins), _SCRATCH.get("lat", n_ins),
            _SCRATCH.get("dep_ptr", n_ins + 1), _SCRATCH.get("dep_idx", 3 * n_ins))
    j, e, macs, hit_b, miss_b, write_b = prog(ta, cores, hits, cost_params(model), *bufs)
    pipe, busy, lat, dep_ptr, dep_idx = bufs[0][:j], bufs[1][:j], bufs[2][:j], bufs[3][:j + 1], bufs[4][:e]
    start, finish, pipe_busy = run_program(pipe, busy, lat, dep_ptr, dep_idx, cores * len(AIC_PIPES) + 1, native,
                                           _SCRATCH)
    pipe_busy = np.asarray(pipe_busy)[:-1].reshape(cores, len(AIC_PIPES)).sum(axis=0)
    names = [f"AIC.{p}" for p in AIC_PIPES]
    # Pipe p of core c is c * 4 + p; the last pipe is the die's HBM (not a core's pipe).
    spans = named_spans(names, pipe_spans(pipe, start, busy, len(AIC_PIPES), cores * len(AIC_PIPES),
                                          native=native))
    return finish_cost(model, op, int(finish.max()), cores, 0, dict(zip(names, (int(b) for b in pipe_busy))),
                       int(miss_b), int(write_b), int(hit_b), int(macs), 0, model.macs_per_cycle(dtype), spans)
