"""Operators on the die as templates of pipe instructions: vector ops on AIVs, attention
blocks on AIC+AIV clusters, and the matmul steps both use.

Every number here is either a count of the op's own arithmetic (how many passes over the data
an RMSNorm makes) or comes from the DieSpec through ``DieModel``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cmemu.die.l2 import lru_miss_byte
from cmemu.die.model import AIC_PIPES, AIV_PIPES, DTYPE_BYTES, DieModel, OpCost, ceil_div, check_size, finish_cost
from cmemu.die.pipeline import named_spans, pipe_spans, run_program
from cmemu.die.template import Template, expand

ACC_BYTES = 4
FP32 = 4
MAX_GENERIC_CHUNKS = 256

# Vector ops: (values read per element, values written per element, passes of the vector unit
# over the element in fp32). Values are of the op's dtype (bf16 by default), except quant_int8's
# output (1 B) and its per-row fp32 scale. Passes count the op's arithmetic, one vector
# instruction per step:
VECTOR_OPS = {
    # cast to fp32, square, reduce-sum, scale by 1/rms, multiply by the weight, cast back
    "rmsnorm": (1, 1, 6),
    # cast, multiply by cos, multiply the rotated half by sin, add, cast (cos and sin read too)
    "rope": (3, 1, 5),
    # cast gate and up, exp, add 1, reciprocal (sigmoid), x * sigmoid, * up, cast
    "swiglu": (2, 1, 8),
    # cast, max-reduce, subtract, exp, sum-reduce, multiply by the reciprocal, cast
    "softmax": (1, 1, 7),
    # cast, abs, max-reduce, scale, cast fp32 -> fp16 -> int8 (per-token scale written too)
    "quant_int8": (1, 0, 6),
    # FlashDecoding combine, over each split's partial output and softmax max and sum (fp32):
    # scale by the split's weight, add into the sum (the output's write is the caller's; assumed)
    "flash_combine": (1, 0, 2),
}


def _mte2_busy(model: DieModel, nbytes: int, rate_milli: int) -> int:
    return model.die.mte2_startup_cycles + ceil_div(nbytes * 1000, rate_milli)


def _mte2_rate(model: DieModel, aiv: bool = False) -> int:
    """One core's MTE2 rate (an AIC's, or an AIV's), milli-bytes per cycle."""
    return model.mte2_milli_byte_per_cycle(aiv)


def _fetch_busy(model: DieModel, nbytes):
    """Cycles the die's HBM (one server shared by all cores, at the rate the HBM model achieves)
    spends fetching ``nbytes`` into L2 for a miss."""
    return -(-np.asarray(nbytes, dtype=np.int64) * 1000 // model.hbm_read_milli_byte_per_cycle())


def vector_cycles(model: DieModel, elements: int, passes: int) -> int:
    """Vector pipe cycles for ``passes`` instructions over ``elements`` fp32 values."""
    d = model.die
    return passes * (d.vector_startup_cycles + ceil_div(elements * FP32, d.vector_bytes_per_cycle))


def _run(model, tpl: Template, block_cluster, var_busy, var_lat, n_clusters, native):
    exp = expand if native else expand.py_func
    prog = exp(*tpl.arrays(), tpl.pipes_per_cluster, np.ascontiguousarray(block_cluster, dtype=np.int64),
               np.ascontiguousarray(var_busy, dtype=np.int64), np.ascontiguousarray(var_lat, dtype=np.int64),
               n_clusters)
    own = n_clusters * tpl.pipes_per_cluster
    start, finish, busy = run_program(*prog, own + tpl.shared_pipes, native=native)
    busy = np.asarray(busy)[:own].reshape(n_clusters, tpl.pipes_per_cluster).sum(axis=0)
    # Per position in the cluster, the busy intervals of all clusters (the shared HBM left out).
    spans = pipe_spans(prog[0], start, prog[1], tpl.pipes_per_cluster, own, native=native)
    return int(finish.max()) if len(finish) else 0, busy, spans


# ----------------------------------------------------------------------------------- vector ops


def vector_cost(model: DieModel, op: str, rows: int, cols: int, cores: int | None = None,
                native: bool = True, dtype: str = "bf16") -> OpCost:
    """A row-wise vector op on ``cores`` AIVs: rows go round-robin to the cores in chunks that
    fill half the Unified Buffer (double buffering); per chunk the HBM fetches the input into L2,
    MTE2 loads it, the vector unit runs the op's passes, MTE3 stores. Inputs come from HBM (a
    producer's output may still be in L2: not modelled), outputs are written through L2."""
    d = model.die
    if op not in VECTOR_OPS:
        raise ValueError(f"unknown vector op {op!r} (known: {', '.join(VECTOR_OPS)})")
    cores = d.aiv_cores if cores is None else cores
    if not 1 <= cores <= d.aiv_cores:
        raise ValueError(f"{cores} AIV requested, the die has {d.aiv_cores}")
    if rows <= 0 or cols <= 0:
        raise ValueError(f"a vector op needs rows > 0 and cols > 0, got {rows} x {cols}")
    n_in, n_out, passes = VECTOR_OPS[op]
    eb = DTYPE_BYTES[dtype]
    in_b = n_in * eb
    out_b = 1 if op == "quant_int8" else n_out * eb
    # Per element in UB: input, output and an fp32 working copy; two of everything (double buffer).
    per_row = cols * (in_b + out_b + FP32)
    rows_per_chunk = max(1, (d.ub_buffer_kib << 10) // (2 * per_row))
    if per_row * 2 > (d.ub_buffer_kib << 10):
        # A row larger than half the UB is cut into column pieces.
        rows_per_chunk = 1
    col_pieces = max(1, ceil_div(per_row * 2, d.ub_buffer_kib << 10))
    chunks_rows = ceil_div(rows, rows_per_chunk)
    n_blocks = chunks_rows * col_pieces
    check_size(f"a {op} of {rows} x {cols}", 3 * n_blocks)
    busy_cores = min(cores, n_blocks)
    rate = _mte2_rate(model, aiv=True)
    tpl = Template(len(AIV_PIPES), shared_pipes=1)
    fetch = tpl.add(tpl.pipes_per_cluster, name="HBM fetch", variable=True)
    ld = tpl.add(0, deps=[fetch], name="MTE2 in", variable=True)
    vec = tpl.add(1, deps=[ld], name="VECTOR", variable=True)
    st = tpl.add(2, deps=[vec], name="MTE3 out", variable=True)
    # Double buffering: a chunk is fetched once the vector pass of the chunk two back has freed
    # its input slot; its vector pass waits for the store of the chunk two back (output slot).
    tpl.deps[fetch].append((vec, 2))
    tpl.deps[vec].append((st, 2))
    block_cluster = np.arange(n_blocks, dtype=np.int64) % busy_cores
    blk = np.arange(n_blocks, dtype=np.int64)
    piece = blk % col_pieces
    ccols = ceil_div(cols, col_pieces)
    r = np.minimum(rows_per_chunk, rows - (blk // col_pieces) * rows_per_chunk)
    el = r * np.minimum(ccols, cols - piece * ccols)
    nin = el * in_b
    nout = el * out_b + (np.where(piece == 0, r * FP32, 0) if op == "quant_int8" else 0)
    rd, wr = int(nin.sum()), int(nout.sum())
    var_busy = np.stack([_fetch_busy(model, nin),
                         d.mte2_startup_cycles + -(-nin * 1000 // rate),
                         passes * (d.vector_startup_cycles + -(-el * FP32 // d.vector_bytes_per_cycle)),
                         d.mte3_startup_cycles + -(-nout // d.mte3_byte_per_cycle)], axis=1)
    lats = [model.hbm_read_latency_cycles, model.l2_hit_latency_cycles, 0, model.l2_hit_latency_cycles]
    var_lat = np.tile(np.array(lats, dtype=np.int64), (n_blocks, 1))
    makespan, busy, spans = _run(model, tpl, block_cluster, var_busy, var_lat, busy_cores, native)
    names = [f"AIV.{p}" for p in AIV_PIPES]
    return finish_cost(model, op, makespan, 0, cores, {n: int(b) for n, b in zip(names, busy)},
                       rd, wr, 0, 0, rows * cols * in_b, 0, named_spans(names, spans))


# ----------------------------------------------------------------------------------- matmul steps


@dataclass(frozen=True)
class MatmulSteps:
    """One m x k x n matmul on one AIC from L1: n cut into parts whose accumulators fit L0C, k
    into steps whose fractals fit half of L0A/L0B (double buffering)."""

    parts: tuple  # per n-part: (list of (mte1 cycles, cube cycles) per k-step, fixpipe cycles)
    macs: int


def matmul_steps(model: DieModel, m: int, k: int, n: int, dtype: str) -> MatmulSteps:
    d = model.die
    ib = DTYPE_BYTES[dtype]
    kg = model.k_granule(dtype)
    pm = ceil_div(m, 16) * 16
    n_part = min(ceil_div(n, 16) * 16, (d.l0c_buffer_kib << 10) // (pm * ACC_BYTES) // 16 * 16)
    if n_part < 16:
        raise ValueError(f"{m} rows of accumulators do not fit L0C")
    parts = []
    for n0 in range(0, n, n_part):
        nn = ceil_div(min(n_part, n - n0), 16) * 16
        bk = min((d.l0a_buffer_kib << 10) // (2 * pm * ib), (d.l0b_buffer_kib << 10) // (2 * nn * ib)) // kg * kg
        if bk < kg:
            raise ValueError(f"a {m} x {nn} matmul leaves no room for a double-buffered k-step in L0A/L0B")
        steps = []
        for k0 in range(0, k, bk):
            kk = ceil_div(min(bk, k - k0), kg) * kg
            mte1 = (2 * d.mte1_startup_cycles + ceil_div(pm * kk * ib, d.mte1_l0a_byte_per_cycle)
                    + ceil_div(kk * nn * ib, d.mte1_l0b_byte_per_cycle))
            cube = d.cube_startup_cycles + (pm // 16) * (nn // 16) * (kk // kg)
            steps.append((mte1, cube))
        fix = d.fixpipe_startup_cycles + ceil_div(pm * nn * ACC_BYTES, d.fixpipe_byte_per_cycle)
        parts.append((steps, fix))
    return MatmulSteps(tuple(parts), m * k * n)


def emit_matmul(tpl: Template, mm: MatmulSteps, deps, fix_lat: int, aic: int = 0):
    """Append a matmul's MTE1/CUBE steps and FixPipe writes to a template (pipes of the AIC at
    offset ``aic``); the first MTE1 waits for ``deps``. Returns (FixPipe instructions, the last
    MTE1: after it the matmul's operands in L1 are no longer needed)."""
    fixes = []
    m1 = None
    last_fix = None
    for steps, fix in mm.parts:
        cubes = []
        for s, (mte1, cube) in enumerate(steps):
            md = list(deps) if s == 0 else []
            if s >= 2:
                md.append(cubes[s - 2])  # the L0A/L0B slot is free once its cube step is done
            m1 = tpl.add(aic + 1, mte1, deps=md, name="MTE1")
            cd = [m1]
            if s == 0 and last_fix is not None:
                cd.append(last_fix)  # L0C holds one accumulator: wait until it is drained
            cubes.append(tpl.add(aic + 2, cube, deps=cd, name="CUBE"))
        last_fix = tpl.add(aic + 3, fix, lat=fix_lat, deps=[cubes[-1]], name="FIXP")
        fixes.append(last_fix)
    return fixes, m1


# ----------------------------------------------------------------------------------- attention

CLUSTER_PIPES = len(AIC_PIPES) + 2 * len(AIV_PIPES)  # 1 AIC + 2 AIV
AIV0, AIV1 = len(AIC_PIPES), len(AIC_PIPES) + len(AIV_PIPES)


def attention_cost(model: DieModel, op: str, units: int, kv_blocks_of_unit: np.ndarray, m: int, d_qk: int,
                   d_v: int, block: int, kv_len_of_block: np.ndarray, kv_shared: bool, dtype: str,
                   kv_object_of_block: np.ndarray, q_bytes: int, cores: int, native: bool = True,
                   kv_copies_of_block: np.ndarray | None = None) -> OpCost:
    """Flash attention on ``cores`` clusters of 1 AIC + 2 AIV (MLA prefill; decode attention
    has its own schedule, ``cmemu.die.fia_mla``). A *unit* is one query tile (m rows: a prefill
    query block of one head); it visits its KV blocks in order, and units go round-robin to the
    clusters.

    Per KV block: MTE2 loads the K (and V) block into L1 (from L2 or HBM, as an LRU over the KV
    objects decides), the cube computes S = Q K^T and FixPipe writes S to GM; after a cross-core
    flag both AIVs load half of S, run the online softmax and write P; after a flag the AIC loads
    P, computes P V and FixPipe writes the partial O; the AIVs fold it into the running output,
    which they store after the unit's last block. The cube is software-pipelined as Ascend's
    flash-attention kernels do: S of block i+1 is computed before P V of block i, so the cube
    works while the AIVs run the softmax. A template step therefore holds QK of block i and PV
    of block i-1; each unit has one step more than blocks (the last step only drains PV).

    kv_shared: K and V are the same cached latent (absorbed MLA decode: V is the first d_v of
    the d_qk values), loaded once per block.
    kv_copies_of_block: MTE2 copies that load each block (a paged cache: K and V of each page
    apart), each with its start-up; default one per block.
    """
    d = model.die
    ib = DTYPE_BYTES[dtype]
    flag = d.cross_core_flag_latency_cycles
    l2lat = model.l2_hit_latency_cycles
    clusters = min(cores, units)
    hit_r = _mte2_rate(model)
    aiv_r = _mte2_rate(model, aiv=True)
    qk = matmul_steps(model, m, d_qk, block, dtype)
    pv = matmul_steps(model, m, block, d_v, dtype)
    half = ceil_div(m, 2)
    tpl = Template(CLUSTER_PIPES, shared_pipes=1)
    part = []  # per template instruction: 0 = step's QK half (block i), 1 = PV half (block i-1)

    def mark(which):
        part.extend([which] * (len(tpl.pipe) - len(part)))

    q_ld = tpl.add(0, name="MTE2 Q")
    kv_fetch = tpl.add(tpl.pipes_per_cluster, name="HBM fetch KV")  # misses only
    kv_ld = tpl.add(0, deps=[kv_fetch], name="MTE2 KV")
    fx_s, _ = emit_matmul(tpl, qk, deps=[q_ld, kv_ld], fix_lat=l2lat)
    s_bytes = half * block * FP32
    p_bytes = half * block * ib
    soft = []
    for aiv in (AIV0, AIV1):
        ld = tpl.add(aiv + 0, _mte2_busy(model, s_bytes, aiv_r), lat=flag + l2lat, deps=fx_s, name="MTE2 S")
        # online softmax: max, subtract, exp, sum, rescale of the running sums, cast to P
        vc = tpl.add(aiv + 1, vector_cycles(model, half * block, VECTOR_OPS["softmax"][2] + 1), deps=[ld],
                     name="VECTOR softmax")
        soft.append(tpl.add(aiv + 2, d.mte3_startup_cycles + ceil_div(p_bytes, d.mte3_byte_per_cycle), lat=l2lat,
                            deps=[vc], name="MTE3 P"))
    mark(0)
    # P V of the previous block: waits for that block's P (one step back).
    p_ld = tpl.add(0, _mte2_busy(model, m * block * ib, hit_r), lat=flag + l2lat, deps=[(x, 1) for x in soft],
                   name="MTE2 P")
    fx_o, pv_last_mte1 = emit_matmul(tpl, pv, deps=[p_ld, (kv_ld, 1)], fix_lat=l2lat)
    o_bytes = half * d_v * FP32
    out_st = []
    for aiv in (AIV0, AIV1):
        ld = tpl.add(aiv + 0, _mte2_busy(model, o_bytes, aiv_r), lat=flag + l2lat, deps=fx_o, name="MTE2 O")
        # rescale the running output and add the block's part: two passes
        vc = tpl.add(aiv + 1, vector_cycles(model, half * d_v, 2), deps=[ld], name="VECTOR rescale")
        out_st.append(tpl.add(aiv + 2, 0, deps=[vc], name="MTE3 out"))
    mark(1)
    # L1 holds three KV blocks (mla._kv_block): the one QK reads, the one PV reads (a step
    # behind) and the one being loaded. Block i reuses the slot of block i - 3, whose P V ran in
    # step i - 2: the load waits until that P V's MTE1 has read its last fractals.
    tpl.deps[kv_fetch].append((pv_last_mte1, 2))
    tpl.deps[kv_ld].append((pv_last_mte1, 2))
    nt = len(tpl.pipe)
    tpl.var = list(range(nt))  # every instruction's time is given per step
    tpl.n_var = nt
    part = np.asarray(part)
    t_busy = np.asarray(tpl.busy, dtype=np.int64)
    t_lat = np.asarray(tpl.lat, dtype=np.int64)

    check_size("this attention", (int(np.sum(kv_blocks_of_unit)) + units) * len(tpl.pipe))
    kv_bytes_of_block = kv_len_of_block * (d_qk if kv_shared else d_qk + d_v) * ib
    # A block may be read in part first (up to a causal diagonal), then whole: the L2 holds the
    # part, HBM gives the rest.
    miss_b = (lru_miss_byte if native else lru_miss_byte.py_func)(
        np.ascontiguousarray(kv_object_of_block, dtype=np.int64), np.ascontiguousarray(kv_bytes_of_block, dtype=np.int64),
        model.l2_capacity_byte, int(kv_object_of_block.max()) + 1)
    # Steps: unit u has kv_blocks_of_unit[u] + 1 of them; step i computes QK of block i (if
    # i < blocks) and PV of block i - 1 (if i > 0).
    per_unit = np.asarray(kv_blocks_of_unit, dtype=np.int64) + 1
    n_steps = int(per_unit.sum())
    step_unit = np.repeat(np.arange(units, dtype=np.int64), per_unit)
    step_i = np.arange(n_steps, dtype=np.int64) - np.repeat(np.cumsum(per_unit) - per_unit, per_unit)
    nbk = per_unit[step_unit] - 1
    qk_on = step_i < nbk
    pv_on = step_i > 0
    on = np.where(part[None, :] == 0, qk_on[:, None], pv_on[:, None])
    var_busy = np.where(on, t_busy[None, :], 0).astype(np.int64)
    var_lat = np.where(on, t_lat[None, :], 0).astype(np.int64)
    first = qk_on & (step_i == 0)
    var_busy[:, q_ld] = np.where(first, _mte2_busy(model, q_bytes, hit_r), 0)
    var_lat[:, q_ld] = np.where(first, l2lat, 0)
    kv_b = np.zeros(n_steps, dtype=np.int64)
    kv_b[qk_on] = kv_bytes_of_block
    fetch_b = np.zeros(n_steps, dtype=np.int64)
    fetch_b[qk_on] = miss_b
    miss_s = fetch_b > 0
    var_busy[:, kv_fetch] = np.where(miss_s, _fetch_busy(model, fetch_b), 0)
    var_lat[:, kv_fetch] = np.where(miss_s, model.hbm_read_latency_cycles, 0)
    copies = np.ones(n_steps, dtype=np.int64)
    if kv_copies_of_block is not None:
        copies[qk_on] = kv_copies_of_block
    var_busy[:, kv_ld] = np.where(qk_on, model.die.mte2_startup_cycles * copies + -(-kv_b * 1000 // hit_r), 0)
    var_lat[:, kv_ld] = np.where(qk_on, l2lat, 0)
    rd = int(miss_b.sum())
    hit_b = int(kv_bytes_of_block.sum()) - rd
    last = step_i == nbk
    out_bytes = half * d_v * ib
    store = d.mte3_startup_cycles + ceil_div(out_bytes, d.mte3_byte_per_cycle)
    for x in out_st:
        var_busy[:, x] = np.where(last, store, 0)
        var_lat[:, x] = np.where(last, l2lat, 0)
    # Units go round-robin to clusters. The program lists the steps in the order they happen
    # (the k-th step of every cluster, then the (k+1)-th): each cluster's own steps stay in its
    # order, and the shared HBM serves the clusters' fetches interleaved, as they come.
    step_cluster = step_unit % clusters
    by_cluster = np.argsort(step_cluster, kind="stable")
    counts = np.bincount(step_cluster, minlength=clusters)
    local = np.empty(n_steps, dtype=np.int64)
    local[by_cluster] = np.arange(n_steps) - np.repeat(np.cumsum(counts) - counts, counts)
    order = np.lexsort((step_cluster, local))
    makespan, busy, spans = _run(model, tpl, step_cluster[order], var_busy[order], var_lat[order], clusters, native)
    names = [f"AIC.{p}" for p in AIC_PIPES] + [f"AIV.{p}" for p in AIV_PIPES] * 2
    out = {}
    for nm, bsy in zip(names, busy):
        out[nm] = out.get(nm, 0) + int(bsy)
    macs = int(np.sum(kv_len_of_block)) * m * (d_qk + d_v)
    return finish_cost(model, op, makespan, clusters, 2 * clusters, out, rd, units * m * d_v * ib, hit_b, macs,
                       0, model.macs_per_cycle(dtype), named_spans(names, spans))


# ----------------------------------------------------------------------------------- generic op


def generic_chunks(die, unit: str, tensor_byte: int, cores: int) -> tuple[int, int, int]:
    """(bytes per core, bytes per chunk, chunks per core) of a generic op on ``cores`` of ``unit``:
    each core streams its share of the bytes in chunks of half its L1 (AIC) or UB (AIV); a huge
    transfer takes bigger chunks (at most MAX_GENERIC_CHUNKS per core), which only lengthens its
    first chunk's start-up, not its steady state."""
    buf = (die.l1_buffer_kib if unit == "aic" else die.ub_buffer_kib) << 10
    per_core_b = ceil_div(int(tensor_byte), cores)
    chunk_b = max(buf // 2, ceil_div(per_core_b, MAX_GENERIC_CHUNKS))
    return per_core_b, chunk_b, max(1, ceil_div(per_core_b, chunk_b))


def generic_cost(model: DieModel, unit: str, num_ops: float, tensor_byte: int, dtype: str, cores: int,
                 native: bool = True) -> OpCost:
    """An op known only by its work (``num_ops``) and HBM bytes (``tensor_size``), with no shape
    to tile: each core streams its share of the bytes through MTE2 in chunks of half its L1 (AIC)
    or UB (AIV), double buffered, while the cube (or vector unit) does its share of the work at
    full rate (no padding: the shape is unknown). So the op takes the longer of its compute and
    its transfer, plus the start-up of the first chunk and the drain of the last."""
    d = model.die
    total = d.aic_cores if unit == "aic" else d.aiv_cores
    if not 1 <= cores <= total:
        raise ValueError(f"{cores} {unit.upper()} requested, the die has {total}")
    if unit == "aic":
        per_cycle = 2 * model.macs_per_cycle(dtype)  # raises for dtypes the cube lacks
    else:
        per_cycle = 2 * d.vector_bytes_per_cycle // DTYPE_BYTES[dtype]  # lanes x fused multiply-add
    per_core_b, chunk_b, n_chunks = generic_chunks(d, unit, tensor_byte, cores)
    ops_core = num_ops / cores
    rate = _mte2_rate(model, aiv=unit == "aiv")
    tpl = Template(2, shared_pipes=1)
    fetch = tpl.add(tpl.pipes_per_cluster, name="HBM fetch", variable=True)
    ld = tpl.add(0, deps=[fetch], name="MTE2", variable=True)
    ex = tpl.add(1, deps=[ld], name="CUBE" if unit == "aic" else "VECTOR", variable=True)
    tpl.deps[fetch].append((ex, 2))
    nb = n_chunks * cores
    var_busy = np.zeros((nb, 3), dtype=np.int64)
    var_lat = np.zeros((nb, 3), dtype=np.int64)
    # Chunk i of every core, then chunk i + 1: the order the cores ask the HBM in.
    cluster = np.tile(np.arange(cores, dtype=np.int64), n_chunks)
    for i in range(n_chunks):
        b = min(chunk_b, per_core_b - i * chunk_b)
        rows = slice(i * cores, (i + 1) * cores)
        if b > 0:
            var_busy[rows, 0] = _fetch_busy(model, b)
            var_lat[rows, 0] = model.hbm_read_latency_cycles
            var_busy[rows, 1] = _mte2_busy(model, b, rate)
            var_lat[rows, 1] = model.l2_hit_latency_cycles
        var_busy[rows, 2] = int(np.ceil(ops_core / n_chunks / per_cycle))
    makespan, busy, spans = _run(model, tpl, cluster, var_busy, var_lat, cores, native)
    pipes = ("MTE2", "CUBE") if unit == "aic" else ("MTE2", "VECTOR")
    names = [f"{unit.upper()}.{p}" for p in pipes]
    peak = model.macs_per_cycle(dtype) if unit == "aic" else 0
    return finish_cost(model, "generic", makespan, cores if unit == "aic" else 0, cores if unit == "aiv" else 0,
                       {n: int(b) for n, b in zip(names, busy)}, int(tensor_byte), 0, 0,
                       int(num_ops // 2) if unit == "aic" else 0, 0, peak, named_spans(names, spans))
