"""MLA decode attention (absorbed DeepSeek-V3 form) as CANN's FusedInferAttentionScore (FIA) MLA
template runs it on one die: its split of the work over the AI cores (``cmemu.die.fia_split``),
the per-tile pipeline of each cluster (1 AIC + 2 AIV) and the FlashDecode combine.

Sources (hicann/ops-transformer at c29bc106, read for this model, not copied; file:line below):
``attention/common/op_kernel/arch32/fia_kernel_nonquant_mla.h`` (kernel.h: the task loop, the
preload, the cross-core flags), ``fia_block_cube_nonquant_mla.h`` (cube.h: Q·Kᵀ and P·V on the
AIC), ``fia_block_vec_nonquant_mla.h`` (vec.h: softmax, AMLA, output on the AIVs),
``fia_block_vec_flashdecode.h`` (fd.h: the combine), ``attention/common/op_kernel/matmul.h``.

What is modelled. A request's query rows (its ``queries_per_request`` tokens x the heads,
token-major) share one M axis; work blocks are (request, M tile of <= 256 rows, KV tile of 512
positions), split over the cores by FIA's cost rule. Each core runs its blocks in order as tasks
of a software pipeline: in iteration L the AIC computes C1 (S = Q·Kᵀ) of task L then C2 (O += P·V)
of task L-1, the AIVs V1 (softmax) of task L-1 then V2 (output) of task L-2 (kernel.h:948-976):

- C1 (cube.h:340-604): per 128 KV positions and half of the 576 values (256 latent + 32 rope),
  MTE2 loads the K chunk (latent and rope as two copies) into one of 3 L1 slots; on the first
  chunk it loads Q (per 128-row sub-block: the latent halves and the rope) into a pair of the 4
  Q/P slots; per 128-row sub-block, MTE1 and the cube run 3 k-steps of 96 (L0A/L0B double
  buffered), the result accumulates over both halves in one of 2 L0C slots, and FixPipe writes
  S (fp32) to the workspace in GM. Then flag 7 to both AIVs.
- V1 (vec.h:959-1047), each AIV on its half of the rows, in chunks of 8192 / positions rows (16
  at 512): MTE2 reads S, the vector unit scales, runs the online softmax and the AMLA step, casts
  P, MTE3 writes P; flag 8 to the AIC. Then, after flag 4 (C2 of the task before is done), for
  every tile but a row's first on the core, the AMLA update: an int32 atomic add onto O in GM
  (64-row pieces, vec.h:897-957) that rescales it by a power of two; flag 5. On a row's last
  tile on the core, a row split over cores also writes its softmax sum and max (vec.h:354-389).
- C2 (cube.h:607-839), after flag 8: per 128 of the 512 output columns and half of the KV
  positions, MTE2 loads V (the latent again: an L2 hit when the L2 model says so), on the first
  column chunk P; 2 k-steps of 128; before its first FixPipe it waits for flag 5; FixPipe
  accumulates O (fp32) in GM, atomically after a row's first tile. Then flags 9 and 4.
- V2 (vec.h:1068-1270), on a row's last tile on the core: MTE2 reads O, the vector unit zeroes
  overflows and divides by the softmax sum, casts, MTE3 writes the output (or, for a row split
  over cores, the fp32 partial).
- FlashDecode (kernel.h:803-881, fd.h:333-423): when a row is split over k cores, after an
  all-AIV barrier the AIVs that SplitFD names combine its 8-row chunks: per chunk MTE2 reads the
  k sums and maxima and the k partials (double buffered, two ahead), the vector unit computes the
  weights and the weighted sum, casts, MTE3 writes the output. A phase of its own after the
  tiles.

A cross-core flag is a zero-time instruction after its producer, usable
``die.cross_core_flag_latency_cycles`` later; a wait holds every later instruction of the
waiting core's section (CrossCoreWaitFlag blocks the core's issue). Buffer reuse (the 3 KV and
4 Q/P L1 slots, L0A/L0B, L0C, the AIVs' input and output buffers) is a dependency of a slot's
producer on the consumer of its previous use. K and V reads go through the L2 model
(``l2.lru_miss_byte``, objects of 128 positions x 128 latent values or x 32 rope values); on a
miss the die's HBM (a shared pipe) fetches the bytes first. Q, S, P, O, the AMLA update and the
FlashDecode partials stay in L2 (workspaces reused every tile): their bytes are counted as L2
traffic (``OpCost.l2_hit_byte``), the output as HBM writes. The program lists the cores'
iterations round by round and each round instruction by instruction
(``template.expand_interleaved``), so the HBM pipe serves the cores' misses interleaved chunk by
chunk as they come.

int8 (``cmemu.dtype``): FIA routes INT8 MLA to IFA's full-quant template
(incre_flash_attention_preload_mla.h), which has the same C1 / V1 + C2 / V2 pipeline; it is
modelled as this schedule with int8 sizes (latent, Q and P in 1 B, rope in bf16, P requantised to
int8), the latent k-steps at the int8 cube rate and the rope ones at bf16, on IFA's split
(``fia_split.plan_split_ifa``: units of 128 rows, so each MTP token its own unit reading the KV,
FlashDecode only for few single-token requests, combined one request per AIV). IFA's own L1 plan
and vector steps (it rescales O without AMLA) are not modelled: the FIA ones stand in.

Left out: the attention mask of speculative tokens (it touches only a request's last tile), the
KV cache write of the new token, paged-KV copies other than 128-position pages (one copy per
128-position piece, as with 128-position pages), the scalar unit, L2 contention with other ops,
the workspaces' own eviction of KV from L2, and jitter between the cores: they run the same work
in lockstep, so their K misses come together in the Q·Kᵀ phases and none in the P·V phases
(memory-bound shapes, few heads, come out above their HBM time; 128 heads are cube-bound).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from cmemu.die.fia_split import FD_CHUNK_ROWS, SplitPlan, plan_split, plan_split_ifa
from cmemu.die.kernels import AIV0, AIV1, CLUSTER_PIPES, FP32, _fetch_busy, vector_cycles
from cmemu.die.l2 import lru_miss_byte
from cmemu.die.model import AIC_PIPES, AIV_PIPES, DTYPE_BYTES, DieModel, OpCost, ceil_div, check_size, finish_cost
from cmemu.die.pipeline import MAX_INTERVALS_PER_PIPE, Program, merge_intervals, named_spans, pipe_spans, run_program
from cmemu.die.template import Template, expand_interleaved

HEAD_DIM = 512  # latent values per position, the output width (kernel.h:86-103)
ROPE_DIM = 64  # rope values per position (kernel.h:86-103)
M_L1 = 128  # rows per cube sub-block (cube.h:118)
N_L1 = 128  # KV positions (C1) or output columns (C2) per chunk (cube.h:119)
MM1_K_L1_LATENT, MM1_K_L1_ROPE = 256, 32  # one C1 L1 chunk: half the latent and half the rope (cube.h:121, 391-420)
MM1_K_L0 = 96  # C1 k-step (cube.h:120)
MM2_K_L1 = 256  # KV positions per C2 L1 chunk (cube.h:621)
MM2_K_L0 = 128  # C2 k-step (cube.h:122)
KV_L1_SLOTS = 3  # L1 slots of 128 x 288 values for K/V chunks (cube.h:219-242)
QP_L1_PAIRS = 2  # 4 L1 slots for Q/P: a pair per 128-row sub-block (cube.h:79-83, 219-242)
L0_SLOTS = 2  # L0A/L0B ping-pong (matmul.h:480-517)
L0C_SLOTS = 2  # two 128 x 128 fp32 accumulators (cube.h:131)
VEC_TILE_ELEMENTS = 8192  # fp32 values per AIV input chunk: a 32 KiB UB buffer (vec.h:157, 966)
POSITION_ALIGN = 32  # V1 rows are padded to a multiple of 32 positions (kernel.h:679-680)
VEC_MIN_SPLIT_ROWS = 16  # tiles of at most this many rows stay on one AIV (vec.h:996)
NUPDATE_ROWS, NUPDATE_COLS = 64, 128  # AMLA update pieces: 64 rows, 128 columns (vec.h:913-914)
NUPDATE_BRCB = 16  # Brcb per piece: a row's value broadcast to 128 int32 (vec.h:928-934)
LSE_VALUES = 8  # a row's softmax sum or max, broadcast to 8 fp32 (vec.h:354-389)
OUT_BYTES = 2  # the output is bf16/fp16 (kernel.h: OUT_T)
ROPE_BYTES = 2  # rope values stay bf16, int8 too (IFA full quant: query_rope/key_rope BF16)
# Vector instructions per V1 chunk: over the chunk's S values, the scale (vec.h:606), the
# online softmax's reduce-max, subtract, exp and reduce-sum (SoftmaxFlashV2, vec.h:679; the
# AscendC library's passes, assumed) and AMLA's row scaling (vec.h:739), then the cast to P
# (vec.h:888); over the chunk's rows, AMLA's 21 per-row steps (vec.h:685-775) and 4 for the
# softmax's running max and sum (assumed: max, exp of the difference, scale, add).
V1_PASSES, V1_ROW_OPS = 6, 21 + 4
# V2: Abs, CompareScalar, Select and RowDivs over O (vec.h:1252-1265), a Brcb of the sums, then
# the cast (vec.h:1202) or, for a split row, the copy to the output buffer (vec.h:1142).
V2_PASSES, V2_ROW_OPS = 4, 1
# FlashDecode combine per chunk: 2 Duplicates over rows x 8, then ColMax, RowSub, Exp, Mul,
# ColAdd, MatDivsVec over splits x rows x 8 (fd.h:230-249); per split RowMuls and, after the
# first, an Add (fd.h:282-286); the cast (fd.h:302).
FD_SCALE_OPS = 6
FD_PREFETCH = 2  # partials loaded ahead, double buffered (fd.h:396-401, 128-145)
# Paged KV: one copy per 128-position page (assumed: CloudMatrix-Infer's page size is not
# published; MLA allows 16 or 128, incre_flash_attention_tiling_check.cpp:1758-1765).
PAGE_POSITIONS = 128

AIC_MTE2, AIC_MTE1, AIC_CUBE, AIC_FIXP = range(4)
HBM = CLUSTER_PIPES  # the die's HBM: the template's shared pipe 0


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def vec_rows(m: int) -> tuple:
    """Rows of a tile of ``m`` rows on AIV 0 and AIV 1 (vec.h:996-1002)."""
    r0 = m if m <= VEC_MIN_SPLIT_ROWS else (ceil_div(m, 16) + 1) // 2 * 16
    return r0, m - r0


def v1_chunk_rows(rows: int, positions: int) -> int:
    """Rows per V1 chunk: as many as fill the AIV's 32 KiB input buffer, a multiple of 8
    (vec.h:966-975)."""
    return min(VEC_TILE_ELEMENTS // _align(positions, POSITION_ALIGN) // 8 * 8, rows)


def v2_chunk_rows(rows: int) -> int:
    return min(VEC_TILE_ELEMENTS // HEAD_DIM, rows)  # vec.h:1095


@dataclass(frozen=True)
class _Late:
    """A dependency on an instruction added later to the template (one ``back`` blocks back)."""

    key: str
    back: int


class _Ring:
    """Buffer slots used in turn: use u waits until the consumer of use u - depth (in this
    block, or in the ones before) has released its slot."""

    def __init__(self, depth: int):
        self.depth = depth
        self.waiters: list = []
        self.released: list = []

    def use(self) -> int:
        self.waiters.append([])
        self.released.append(None)
        return len(self.released) - 1

    def wait(self, u: int, *instrs) -> None:
        self.waiters[u].extend(instrs)

    def release(self, u: int, instr: int) -> None:
        self.released[u] = instr

    def resolve(self, tpl: Template) -> None:
        n = len(self.released)
        for u, waiters in enumerate(self.waiters):
            src, back = u - self.depth, 0
            while src < 0:
                src += n
                back += 1
            if back > 2:
                raise AssertionError("a buffer ring reaches more than 2 blocks back")
            for w in waiters:
                if back == 0 and self.released[src] >= w:
                    raise AssertionError("a buffer slot is released after its next use")
                tpl.deps[w].append((self.released[src], back))


def _zero(_sig):
    return 0, 0, 0, 0


class _Builder:
    """The template of one pipeline iteration, each instruction with its cost function of the
    iteration's tasks (busy cycles, latency, L2 workspace bytes, output bytes)."""

    def __init__(self):
        self.tpl = Template(CLUSTER_PIPES, shared_pipes=1)
        self.fns: list = []
        self.waits = {0: [], 1: [], 2: []}  # per core: the flags its current section waited for
        self.late: list = []
        self.named: dict = {}
        self.fetch_slot: list = []  # (instruction, K/V access slot)

    @staticmethod
    def core(pipe: int) -> int:
        if pipe < len(AIC_PIPES) or pipe == HBM:
            return 0  # the AIC issues its HBM fetches
        return 1 if pipe < AIV1 else 2

    def add(self, pipe: int, fn=_zero, deps=(), name: str = "") -> int:
        now, late = [], []
        for d in list(deps) + self.waits[self.core(pipe)]:
            (late if isinstance(d, _Late) else now).append(d)
        i = self.tpl.add(pipe, deps=now, name=name)
        self.late.extend((i, d) for d in late)
        self.fns.append(fn)
        return i

    def wait(self, core: int, deps) -> None:
        """A CrossCoreWaitFlag: every later instruction of the core's section waits for ``deps``."""
        self.waits[core].extend(deps)

    def end_section(self) -> None:
        self.waits = {0: [], 1: [], 2: []}

    def finish(self, rings) -> Template:
        for r in rings:
            r.resolve(self.tpl)
        for i, d in self.late:
            self.tpl.deps[i].append((self.named[d.key], d.back))
        n = len(self.tpl.pipe)
        self.tpl.var = list(range(n))  # every instruction's time is given per block
        self.tpl.n_var = n
        return self.tpl


@dataclass(frozen=True)
class _Shape:
    n_sub: int  # 128-row sub-blocks per M tile (at most)
    n_c1: int  # C1 chunks of 128 positions per KV tile
    n_c2: int  # C2 chunks of 256 positions per KV tile
    v1_chunks: int  # V1 chunks per AIV (at most)
    v2_chunks: int
    nu_pieces: int  # AMLA update pieces of 64 rows per AIV (at most)


def _sub_rows(m: int, j: int) -> int:
    return max(0, min(M_L1, m - j * M_L1))


def _piece(s: int, p: int, size: int) -> int:
    return max(0, min(size, s - p * size))


@lru_cache(maxsize=64)
def _built(model: DieModel, dtype: str, sh: _Shape):
    """The iteration template of a shape (``_build``), its instructions' arrays, and a memo of
    the per-instruction costs of each block signature seen."""
    tpl, fns, fetch_slot = _build(model, dtype, sh)
    return tpl, fns, fetch_slot, {}


def _costs(fns, memo: dict, sig):
    """(busy, latency) per instruction, L2 workspace bytes and output bytes of a block."""
    row = memo.get(sig)
    if row is None:
        vals = [fn(sig) for fn in fns]
        row = (np.array([v[0] for v in vals], dtype=np.int64), np.array([v[1] for v in vals], dtype=np.int64),
               sum(v[2] for v in vals), sum(v[3] for v in vals))
        memo[sig] = row
    return row


def _build(model: DieModel, dtype: str, sh: _Shape):
    """The iteration template: C1 of task L, V1 and the AMLA update of task L-1, C2 of task L-1,
    V2 of task L-2. A block signature is (c1, mid, v2): c1 = (rows, positions) of task L; mid =
    (rows, positions, first, last, split) of task L-1; v2 = (rows, last, split) of task L-2
    (None when the core has no such task)."""
    d = model.die
    ib = DTYPE_BYTES[dtype]
    kg = model.k_granule(dtype)
    kg_rope = model.k_granule("bf16")
    l2lat = model.l2_hit_latency_cycles
    flag = d.cross_core_flag_latency_cycles
    aic_rate = model.mte2_milli_byte_per_cycle()
    aiv_rate = model.mte2_milli_byte_per_cycle(aiv=True)

    def mte2(nbytes, rate):
        return d.mte2_startup_cycles + ceil_div(nbytes * 1000, rate)

    def mte3(nbytes):
        return d.mte3_startup_cycles + ceil_div(nbytes, d.mte3_byte_per_cycle)

    def mte1(a_bytes, b_bytes):
        return (2 * d.mte1_startup_cycles + ceil_div(a_bytes, d.mte1_l0a_byte_per_cycle)
                + ceil_div(b_bytes, d.mte1_l0b_byte_per_cycle))

    def fixp(rows, cols):
        return d.fixpipe_startup_cycles + ceil_div(_align(rows, 16) * _align(cols, 16) * FP32, d.fixpipe_byte_per_cycle)

    def flag_fn(which):
        return lambda sig: (0, flag, 0, 0) if sig[which] is not None else (0, 0, 0, 0)

    B = _Builder()
    kv_ring, qp_ring = _Ring(KV_L1_SLOTS), _Ring(QP_L1_PAIRS)
    l0_ring, l0c_ring = _Ring(L0_SLOTS), _Ring(L0C_SLOTS)
    in_ring = [_Ring(2), _Ring(2)]  # each AIV's input buffer pair (vec.h:213)
    out_ring = [_Ring(1), _Ring(1)]  # each AIV's output buffer (vec.h:215)
    slot = 0

    # ---- C1: S = Q K^T of task L (cube.h:340-604) -----------------------------------------
    # k-steps of one half (256 latent + 32 rope values): latent 96, 96, 64 and rope 0, 0, 32.
    steps1 = [(min(MM1_K_L0, MM1_K_L1_LATENT - k), max(0, k + MM1_K_L0 - MM1_K_L1_LATENT))
              for k in range(0, MM1_K_L1_LATENT + MM1_K_L1_ROPE, MM1_K_L0)]
    q_loads = {j: [] for j in range(sh.n_sub)}
    q_use, acc = {}, {}
    mm1_fix = []
    for n in range(sh.n_c1):
        for half in (0, 1):
            u = kv_ring.use()
            copies = []
            # The latent half and the rope half of the chunk (rope first in the second half).
            for part in ((0, 1) if half == 0 else (1, 0)):
                def k_fn(sig, n=n, part=part):
                    if sig[0] is None:
                        return _zero(sig)
                    pos = _piece(sig[0][1], n, N_L1)
                    if pos == 0:
                        return _zero(sig)
                    nb = pos * (MM1_K_L1_LATENT * ib if part == 0 else MM1_K_L1_ROPE * ROPE_BYTES)
                    return mte2(nb, aic_rate), l2lat, 0, 0
                f = B.add(HBM, name="HBM fetch K")
                B.fetch_slot.append((f, slot))
                slot += 1
                ld = B.add(AIC_MTE2, k_fn, deps=[f], name="MTE2 K")
                kv_ring.wait(u, f, ld)
                copies.append(ld)
            last = None
            for j in range(sh.n_sub):
                if n == 0:
                    parts = ((MM1_K_L1_LATENT, ib), (ROPE_DIM, ROPE_BYTES)) if half == 0 else ((MM1_K_L1_LATENT, ib),)
                    for cols, cb in parts:
                        def q_fn(sig, j=j, cols=cols, cb=cb):
                            rows = _sub_rows(sig[0][0], j) if sig[0] is not None else 0
                            if rows == 0:
                                return _zero(sig)
                            return mte2(rows * cols * cb, aic_rate), l2lat, rows * cols * cb, 0
                        q = B.add(AIC_MTE2, q_fn, name="MTE2 Q")
                        if half == 0:
                            if j not in q_use:
                                q_use[j] = qp_ring.use()
                            qp_ring.wait(q_use[j], q)
                        q_loads[j].append(q)
                for ks, (lat_k, rope_k) in enumerate(steps1):
                    def m1_fn(sig, j=j, n=n, lat_k=lat_k, rope_k=rope_k):
                        if sig[0] is None:
                            return _zero(sig)
                        rows, pos = _sub_rows(sig[0][0], j), _piece(sig[0][1], n, N_L1)
                        if rows == 0 or pos == 0:
                            return _zero(sig)
                        k_bytes = lat_k * ib + rope_k * ROPE_BYTES
                        return mte1(_align(rows, 16) * k_bytes, _align(pos, 16) * k_bytes), 0, 0, 0

                    def cube_fn(sig, j=j, n=n, lat_k=lat_k, rope_k=rope_k):
                        if sig[0] is None:
                            return _zero(sig)
                        rows, pos = _sub_rows(sig[0][0], j), _piece(sig[0][1], n, N_L1)
                        if rows == 0 or pos == 0:
                            return _zero(sig)
                        depth = ceil_div(lat_k, kg) + ceil_div(rope_k, kg_rope)
                        fractals = (_align(rows, 16) // 16) * (_align(pos, 16) // 16)
                        return d.cube_startup_cycles + fractals * depth, 0, 0, 0
                    lu = l0_ring.use()
                    m1 = B.add(AIC_MTE1, m1_fn, deps=copies + q_loads[j], name="MTE1")
                    l0_ring.wait(lu, m1)
                    cu = B.add(AIC_CUBE, cube_fn, deps=[m1], name="CUBE QK")
                    l0_ring.release(lu, cu)
                    if half == 0 and ks == 0:
                        acc[(n, j)] = l0c_ring.use()
                        l0c_ring.wait(acc[(n, j)], cu)
                    last = m1
                    if half == 1 and n == sh.n_c1 - 1 and ks == len(steps1) - 1:
                        qp_ring.release(q_use[j], m1)  # Q stays in L1 for all chunks (cube.h:560-566)
                if half == 1:
                    def fix_fn(sig, j=j, n=n):
                        if sig[0] is None:
                            return _zero(sig)
                        rows, pos = _sub_rows(sig[0][0], j), _piece(sig[0][1], n, N_L1)
                        if rows == 0 or pos == 0:
                            return _zero(sig)
                        return fixp(rows, pos), l2lat, rows * pos * FP32, 0
                    fx = B.add(AIC_FIXP, fix_fn, deps=[cu], name="FIXP S")
                    l0c_ring.release(acc[(n, j)], fx)
                    mm1_fix.append(fx)
            kv_ring.release(u, last)
    set7 = B.add(AIC_FIXP, flag_fn(0), deps=mm1_fix, name="SET C1->V1")  # kernel.h:778

    # ---- V1 of task L-1 on each AIV (vec.h:986-1024) ---------------------------------------
    set8, set5 = [], []
    for a, base in ((0, AIV0), (1, AIV1)):
        B.wait(1 + a, [(set7, 1)])
        v1_st = []
        for c in range(sh.v1_chunks):
            def rows_of(sig, a=a, c=c):
                if sig[1] is None:
                    return 0, 0
                m, s = sig[1][0], sig[1][1]
                r = vec_rows(m)[a]
                cs = v1_chunk_rows(r, s) if r else 0
                return (max(0, min(cs, r - c * cs)) if cs else 0), _align(s, POSITION_ALIGN)

            def s_fn(sig, rows_of=rows_of):
                rc, sa = rows_of(sig)
                return (mte2(rc * sa * FP32, aiv_rate), l2lat, rc * sa * FP32, 0) if rc else _zero(sig)

            def soft_fn(sig, rows_of=rows_of):
                rc, sa = rows_of(sig)
                if not rc:
                    return _zero(sig)
                return vector_cycles(model, rc * sa, V1_PASSES) + vector_cycles(model, rc, V1_ROW_OPS), 0, 0, 0

            def cast_fn(sig, rows_of=rows_of):
                rc, sa = rows_of(sig)
                return (vector_cycles(model, rc * sa, 1), 0, 0, 0) if rc else _zero(sig)

            def p_fn(sig, rows_of=rows_of):
                rc, sa = rows_of(sig)
                return (mte3(rc * sa * ib), l2lat, rc * sa * ib, 0) if rc else _zero(sig)
            u = in_ring[a].use()
            ld = B.add(base + 0, s_fn, name="MTE2 S")
            in_ring[a].wait(u, ld)
            vc = B.add(base + 1, soft_fn, deps=[ld], name="VECTOR softmax+AMLA")
            uo = out_ring[a].use()
            ca = B.add(base + 1, cast_fn, deps=[vc], name="VECTOR cast P")
            out_ring[a].wait(uo, ca)
            in_ring[a].release(u, ca)
            st = B.add(base + 2, p_fn, deps=[ca], name="MTE3 P")
            out_ring[a].release(uo, st)
            v1_st.append(st)
        set8.append(B.add(base + 2, flag_fn(1), deps=v1_st, name="SET V1->C2"))  # vec.h:1036
        B.end_section()
        # The AMLA update of O, after C2 of the task before (flag 4, vec.h:1037-1039).
        B.wait(1 + a, [_Late("c2_set", 1)])
        nu_st = []
        for piece in range(sh.nu_pieces):
            def nu_rows(sig, a=a, piece=piece):
                if sig[1] is None or sig[1][2]:  # none on a row's first tile (vec.h:904-906)
                    return 0
                r = _align(vec_rows(sig[1][0])[a], 16) if vec_rows(sig[1][0])[a] else 0
                return max(0, min(NUPDATE_ROWS, r - piece * NUPDATE_ROWS))

            def brcb_fn(sig, nu_rows=nu_rows):
                r = nu_rows(sig)
                return (vector_cycles(model, r * LSE_VALUES, NUPDATE_BRCB), 0, 0, 0) if r else _zero(sig)

            def nu_fn(sig, nu_rows=nu_rows):
                r = nu_rows(sig)
                nb = r * NUPDATE_COLS * FP32
                return (mte3(nb), l2lat, nb, 0) if r else _zero(sig)
            uo = out_ring[a].use()
            vb = B.add(base + 1, brcb_fn, name="VECTOR nUpdate")
            out_ring[a].wait(uo, vb)
            for _ in range(HEAD_DIM // NUPDATE_COLS):  # 4 atomic copies of 128 columns (vec.h:948-951)
                st = B.add(base + 2, nu_fn, deps=[vb], name="MTE3 nUpdate")
                nu_st.append(st)
            out_ring[a].release(uo, st)
        set5.append(B.add(base + 2, flag_fn(1), deps=nu_st, name="SET nUpdate->C2"))  # vec.h:1041
        # A split row's softmax sum and max on its last tile here (vec.h:1043-1052).
        for _ in ("sum", "max"):
            def lse_rows(sig, a=a):
                t = sig[1]
                return vec_rows(t[0])[a] if t is not None and t[3] and t[4] else 0

            def lse_v(sig, lse_rows=lse_rows):
                r = lse_rows(sig)
                return (vector_cycles(model, r * LSE_VALUES, 1), 0, 0, 0) if r else _zero(sig)

            def lse_st(sig, lse_rows=lse_rows):
                r = lse_rows(sig)
                nb = r * LSE_VALUES * FP32
                return (mte3(nb), l2lat, nb, 0) if r else _zero(sig)
            vb = B.add(base + 1, lse_v, name="VECTOR LSE")
            B.add(base + 2, lse_st, deps=[vb], name="MTE3 LSE")
        B.end_section()

    # ---- C2: O += P V of task L-1 (cube.h:607-839) -----------------------------------------
    B.wait(0, set8)  # kernel.h:796
    p_use, p_loads = {}, {}
    mm2_fix = []
    steps2 = MM2_K_L1 // MM2_K_L0
    for n in range(HEAD_DIM // N_L1):
        for k1 in range(sh.n_c2):
            u = kv_ring.use()
            copies = []
            for h in (0, 1):  # two 128-position pieces per 256-position chunk (cube.h:670-706)
                def v_fn(sig, k1=k1, h=h):
                    if sig[1] is None:
                        return _zero(sig)
                    pos = _piece(sig[1][1], 2 * k1 + h, N_L1)
                    return (mte2(pos * N_L1 * ib, aic_rate), l2lat, 0, 0) if pos else _zero(sig)
                f = B.add(HBM, name="HBM fetch V")
                B.fetch_slot.append((f, slot))
                slot += 1
                ld = B.add(AIC_MTE2, v_fn, deps=[f], name="MTE2 V")
                kv_ring.wait(u, f, ld)
                copies.append(ld)
            last = None
            for j in range(sh.n_sub):
                if n == 0:
                    def pl_fn(sig, j=j, k1=k1):
                        if sig[1] is None:
                            return _zero(sig)
                        rows, kpos = _sub_rows(sig[1][0], j), _piece(sig[1][1], k1, MM2_K_L1)
                        nb = rows * kpos * ib
                        return (mte2(nb, aic_rate), l2lat, nb, 0) if nb else _zero(sig)
                    pl = B.add(AIC_MTE2, pl_fn, name="MTE2 P")
                    if j not in p_use:
                        p_use[j] = qp_ring.use()
                    qp_ring.wait(p_use[j], pl)
                    p_loads[(j, k1)] = pl
                for ks in range(steps2):
                    def kk_of(sig, j=j, k1=k1, ks=ks):
                        if sig[1] is None:
                            return 0, 0
                        kpos = _piece(sig[1][1], k1, MM2_K_L1)
                        return _sub_rows(sig[1][0], j), _piece(kpos, ks, MM2_K_L0)

                    def m2_fn(sig, kk_of=kk_of):
                        rows, kk = kk_of(sig)
                        if not rows or not kk:
                            return _zero(sig)
                        pk = _align(kk, 16)
                        return mte1(_align(rows, 16) * pk * ib, pk * N_L1 * ib), 0, 0, 0

                    def c2_fn(sig, kk_of=kk_of):
                        rows, kk = kk_of(sig)
                        if not rows or not kk:
                            return _zero(sig)
                        fractals = (_align(rows, 16) // 16) * (N_L1 // 16)
                        return d.cube_startup_cycles + fractals * ceil_div(kk, kg), 0, 0, 0
                    lu = l0_ring.use()
                    m1 = B.add(AIC_MTE1, m2_fn, deps=copies + [p_loads[(j, k1)]], name="MTE1")
                    l0_ring.wait(lu, m1)
                    cu = B.add(AIC_CUBE, c2_fn, deps=[m1], name="CUBE PV")
                    l0_ring.release(lu, cu)
                    if k1 == 0 and ks == 0:
                        acc[("o", n, j)] = l0c_ring.use()
                        l0c_ring.wait(acc[("o", n, j)], cu)
                    last = m1
                    if n == HEAD_DIM // N_L1 - 1 and k1 == sh.n_c2 - 1 and ks == steps2 - 1:
                        qp_ring.release(p_use[j], m1)
                if k1 == sh.n_c2 - 1:
                    if n == 0 and j == 0:
                        B.wait(0, set5)  # before the first FixPipe (cube.h:797-799)

                    def o_fn(sig, j=j):
                        if sig[1] is None:
                            return _zero(sig)
                        rows = _sub_rows(sig[1][0], j)
                        return (fixp(rows, N_L1), l2lat, rows * N_L1 * FP32, 0) if rows else _zero(sig)
                    fx = B.add(AIC_FIXP, o_fn, deps=[cu], name="FIXP O")
                    l0c_ring.release(acc[("o", n, j)], fx)
                    mm2_fix.append(fx)
            kv_ring.release(u, last)
    B.named["c2_set"] = B.add(AIC_FIXP, flag_fn(1), deps=mm2_fix, name="SET C2->V")  # kernel.h:798-799
    B.end_section()

    # ---- V2 of task L-2 on each AIV (vec.h:1054-1270) --------------------------------------
    for a, base in ((0, AIV0), (1, AIV1)):
        B.wait(1 + a, [_Late("c2_set", 1)])  # flag 9 (vec.h:1085)
        for c in range(sh.v2_chunks):
            def o_rows(sig, a=a, c=c):
                t = sig[2]
                if t is None or not t[1]:  # only on the row's last tile on the core
                    return 0
                r = vec_rows(t[0])[a]
                cs = v2_chunk_rows(r) if r else 0
                return max(0, min(cs, r - c * cs)) if cs else 0

            def ol_fn(sig, o_rows=o_rows):
                r = o_rows(sig)
                nb = r * HEAD_DIM * FP32
                return (mte2(nb, aiv_rate), l2lat, nb, 0) if r else _zero(sig)

            def ov_fn(sig, o_rows=o_rows):
                r = o_rows(sig)
                if not r:
                    return _zero(sig)
                return vector_cycles(model, r * HEAD_DIM, V2_PASSES) + vector_cycles(model, r, V2_ROW_OPS), 0, 0, 0

            def oc_fn(sig, o_rows=o_rows):
                r = o_rows(sig)
                return (vector_cycles(model, r * HEAD_DIM, 1), 0, 0, 0) if r else _zero(sig)

            def os_fn(sig, o_rows=o_rows):
                r = o_rows(sig)
                if not r:
                    return _zero(sig)
                if sig[2][2]:  # a split row: the fp32 partial to the FlashDecode workspace
                    nb = r * HEAD_DIM * FP32
                    return mte3(nb), l2lat, nb, 0
                nb = r * HEAD_DIM * OUT_BYTES
                return mte3(nb), l2lat, 0, nb
            u = in_ring[a].use()
            ld = B.add(base + 0, ol_fn, name="MTE2 O")
            in_ring[a].wait(u, ld)
            vc = B.add(base + 1, ov_fn, deps=[ld], name="VECTOR normalise")
            in_ring[a].release(u, vc)
            uo = out_ring[a].use()
            ca = B.add(base + 1, oc_fn, deps=[vc], name="VECTOR cast out")
            out_ring[a].wait(uo, ca)
            st = B.add(base + 2, os_fn, deps=[ca], name="MTE3 out")
            out_ring[a].release(uo, st)
        B.end_section()
    tpl = B.finish([kv_ring, qp_ring, l0_ring, l0c_ring, *in_ring, *out_ring])
    return tpl, B.fns, B.fetch_slot


def _run_interleaved(tpl: Template, block_cluster, block_round, var_busy, var_lat, n_clusters: int, native: bool):
    """(makespan, busy cycles per pipe position summed over the clusters, busy spans per
    position) of the template's blocks in rounds (``template.expand_interleaved``): the die's
    HBM, a shared in-order pipe, serves the cores' fetches interleaved chunk by chunk as they
    come, not one core's whole iteration before the next core's."""
    exp = expand_interleaved if native else expand_interleaved.py_func
    prog = exp(*tpl.arrays(), tpl.pipes_per_cluster, np.ascontiguousarray(block_cluster, dtype=np.int64),
               np.ascontiguousarray(block_round, dtype=np.int64), np.ascontiguousarray(var_busy, dtype=np.int64),
               np.ascontiguousarray(var_lat, dtype=np.int64), n_clusters)
    own = n_clusters * tpl.pipes_per_cluster
    start, finish, busy = run_program(*prog, own + tpl.shared_pipes, native=native)
    busy = np.asarray(busy)[:own].reshape(n_clusters, tpl.pipes_per_cluster).sum(axis=0)
    spans = pipe_spans(prog[0], start, prog[1], tpl.pipes_per_cluster, own, native=native)
    return int(finish.max()) if len(finish) else 0, busy, spans


def _kv_slots(sh: _Shape):
    """The K/V access slots of an iteration, in the template's order: (task: 0 = C1's, 1 =
    C2's, piece, parts); parts index a piece's L2 objects: latent quarters 0-3, rope halves 4-5."""
    slots = []
    for n in range(sh.n_c1):
        slots += [(0, n, (0, 1)), (0, n, (4,)), (0, n, (5,)), (0, n, (2, 3))]
    for n in range(HEAD_DIM // N_L1):
        for k1 in range(sh.n_c2):
            slots += [(1, 2 * k1, (n,)), (1, 2 * k1 + 1, (n,))]
    return slots


def _task_table(plan: SplitPlan):
    """Per block of the plan: (first, last, split) on its core."""
    n = len(plan.request)
    row = plan.request * (plan.m_tile.max() + 1) + plan.m_tile
    core = np.repeat(np.arange(plan.cores_used), plan.blocks_per_core)
    first = np.ones(n, dtype=bool)
    first[1:] = (row[1:] != row[:-1]) | (core[1:] != core[:-1])
    last = np.ones(n, dtype=bool)
    last[:-1] = (row[1:] != row[:-1]) | (core[1:] != core[:-1])
    split_rows = {(h.request, h.m_tile) for h in plan.fd_heads}
    split = np.array([(int(b), int(g)) in split_rows for b, g in zip(plan.request, plan.m_tile)], dtype=bool)
    return first, last, split


def attention_tiles_cost(model: DieModel, plan: SplitPlan, dtype: str, native: bool = True) -> OpCost:
    """The tiles of a decode attention on the plan's cores: the pipelined C1/V1/C2/V2 schedule
    (without the FlashDecode combine)."""
    ib = DTYPE_BYTES[dtype]
    cores = plan.cores_used
    counts = plan.blocks_per_core
    m_max = int(plan.rows.max())
    r0 = max(vec_rows(int(m))[0] for m in np.unique(plan.rows))
    sh = _Shape(n_sub=ceil_div(m_max, M_L1), n_c1=ceil_div(plan.s2_base, N_L1), n_c2=ceil_div(plan.s2_base, MM2_K_L1),
                v1_chunks=max(ceil_div(vec_rows(int(m))[0], v1_chunk_rows(vec_rows(int(m))[0], int(s)))
                              for m, s in set(zip(plan.rows.tolist(), plan.positions.tolist()))),
                v2_chunks=ceil_div(r0, v2_chunk_rows(r0)), nu_pieces=ceil_div(_align(r0, 16), NUPDATE_ROWS))
    tpl, fns, fetch_slot, memo = _built(model, dtype, sh)
    nt = len(tpl.pipe)
    n_iter = int(counts.sum()) + 2 * cores  # every core drains its pipeline with 2 more iterations
    check_size("this decode attention", n_iter * nt)

    # Iterations: core c's i-th has task i (C1), i-1 (V1, C2), i-2 (V2) of its range. The
    # program lists them in the order they happen (the k-th of every core, then the (k+1)-th),
    # and the L2 sees the reads in that order.
    first, last, split = _task_table(plan)
    it_core = np.repeat(np.arange(cores), counts + 2)
    it_i = np.arange(n_iter) - np.repeat(np.cumsum(counts + 2) - (counts + 2), counts + 2)
    order = np.lexsort((it_core, it_i))
    it_core, it_i = it_core[order], it_i[order]
    base = np.repeat(plan.starts[:-1], counts + 2)[order]
    cnt = np.repeat(counts, counts + 2)[order]

    def task(k):  # block index of task i - k of each iteration, -1 if none
        i = it_i - k
        return np.where((i >= 0) & (i < cnt), base + i, -1)
    t0, t1, t2 = task(0), task(1), task(2)
    rows, pos = plan.rows.tolist(), plan.positions.tolist()
    fl, la, sp = first.tolist(), last.tolist(), split.tolist()
    table = {}
    sig_id = np.fromiter((table.setdefault(((rows[a], pos[a]) if a >= 0 else None,
                                            (rows[b], pos[b], fl[b], la[b], sp[b]) if b >= 0 else None,
                                            (rows[c], la[c], sp[c]) if c >= 0 else None), len(table))
                          for a, b, c in zip(t0.tolist(), t1.tolist(), t2.tolist())), dtype=np.int64, count=n_iter)
    rows_t = [_costs(fns, memo, s) for s in table]  # dicts keep insertion order: row k is signature k
    busy_t = np.stack([r[0] for r in rows_t])
    lat_t = np.stack([r[1] for r in rows_t])
    l2_t = np.array([r[2] for r in rows_t], dtype=np.int64)
    out_t = np.array([r[3] for r in rows_t], dtype=np.int64)
    var_busy, var_lat = busy_t[sig_id], lat_t[sig_id]

    # K and V through the L2: objects of 128 positions x (a latent quarter or a rope half).
    slots = _kv_slots(sh)
    if np.any(plan.first % N_L1):
        raise ValueError(f"KV tiles must start at multiples of {N_L1} positions (the L2 model's objects)")
    pieces = int((plan.first + plan.positions).max()) // N_L1 + 1  # of a request, at most
    obj_cols, byte_cols, slot_of = [], [], []
    for si, (which, piece, parts) in enumerate(slots):
        t = t0 if which == 0 else t1
        ok = t >= 0
        tt = np.where(ok, t, 0)
        prows = np.where(ok, np.clip(plan.positions[tt] - piece * N_L1, 0, N_L1), 0)
        first_obj = (plan.request[tt] * pieces + plan.first[tt] // N_L1 + piece) * 6
        for part in parts:
            obj_cols.append(first_obj + part)
            byte_cols.append(prows * (HEAD_DIM // 4 * ib if part < 4 else ROPE_DIM // 2 * ROPE_BYTES))
            slot_of.append(si)
    obj = np.stack(obj_cols, axis=1)
    nbytes = np.stack(byte_cols, axis=1)
    valid = nbytes > 0
    miss = np.zeros_like(nbytes)
    fn_lru = lru_miss_byte if native else lru_miss_byte.py_func
    miss[valid] = fn_lru(np.ascontiguousarray(obj[valid]), np.ascontiguousarray(nbytes[valid]),
                         model.l2_capacity_byte, int(obj.max()) + 1)
    # A slot's objects are adjacent columns; each slot has its HBM fetch instruction.
    slot_miss = np.add.reduceat(miss, np.searchsorted(np.asarray(slot_of), np.arange(len(slots))), axis=1)
    ins = np.array([i for i, _ in fetch_slot], dtype=np.int64)
    fm = slot_miss[:, [si for _, si in fetch_slot]]
    var_busy[:, ins] = np.where(fm > 0, _fetch_busy(model, fm), 0)
    var_lat[:, ins] = np.where(fm > 0, model.hbm_read_latency_cycles, 0)
    makespan, busy, spans = _run_interleaved(tpl, it_core, it_i, var_busy, var_lat, cores, native)
    names = [f"AIC.{p}" for p in AIC_PIPES] + [f"AIV.{p}" for p in AIV_PIPES] * 2
    out = {}
    for nm, bsy in zip(names, busy):
        out[nm] = out.get(nm, 0) + int(bsy)
    kv_b = int(nbytes.sum())
    rd = int(miss.sum())
    l2_ws = int(l2_t[sig_id].sum())
    wr = int(out_t[sig_id].sum())
    macs = int(np.sum(plan.rows * plan.positions)) * (HEAD_DIM + ROPE_DIM + HEAD_DIM)
    return finish_cost(model, "mla_attention.tiles", makespan, cores, 2 * cores, out, rd, wr, kv_b - rd + l2_ws,
                       macs, 0, model.macs_per_cycle(dtype), named_spans(names, spans))


def flash_decode_cost(model: DieModel, plan: SplitPlan, native: bool = True) -> OpCost | None:
    """The FlashDecode combine (after the all-AIV barrier; kernel.h:803-856, fd.h:333-423) on
    the AIVs SplitFD chose, or None when no row is split."""
    if not plan.fd_heads:
        return None
    chunks = tuple(tuple((plan.fd_heads[h].splits, min(FD_CHUNK_ROWS, plan.fd_heads[h].rows - c * FD_CHUNK_ROWS))
                         for h, c in v) for v in plan.combine)
    arr, l2_b, out_b = _combine_program(model, chunks)
    n_vec = len(chunks)
    start, finish, busy = run_program(*arr, n_vec * len(AIV_PIPES), native=native)
    names = [f"AIV.{p}" for p in AIV_PIPES]
    spans = named_spans(names, pipe_spans(arr[0], start, arr[1], len(AIV_PIPES), n_vec * len(AIV_PIPES),
                                          native=native))
    busy = np.asarray(busy).reshape(n_vec, len(AIV_PIPES)).sum(axis=0)
    per_pipe = {nm: int(b) for nm, b in zip(names, busy)}
    return finish_cost(model, "mla_attention.fd_combine", int(finish.max()), 0, n_vec, per_pipe, 0, out_b, l2_b, 0,
                       0, 0, spans)


@lru_cache(maxsize=256)
def _combine_program(model: DieModel, chunks: tuple):
    """The combine's program (``pipeline.Program`` arrays), its L2 bytes and its output bytes;
    ``chunks``: per AIV, its chunks' (splits, rows) in order."""
    d = model.die
    l2lat = model.l2_hit_latency_cycles
    rate = model.mte2_milli_byte_per_cycle(aiv=True)

    def mte2(nbytes):
        return d.mte2_startup_cycles + ceil_div(nbytes * 1000, rate)

    def mte3(nbytes):
        return d.mte3_startup_cycles + ceil_div(nbytes, d.mte3_byte_per_cycle)
    MTE2, VEC, MTE3 = range(3)
    prog = Program(len(AIV_PIPES))
    l2_b = out_b = 0
    for v, mine in enumerate(chunks):
        # SyncAll: every AIV's main loop is done (the tiles phase ends); assumed one cross-core
        # hand-off through GM, as a flag.
        bar = prog.add(v, MTE2, 0, d.cross_core_flag_latency_cycles)
        scales, reduces, prev_store = [], [], -1
        for ci, (k, rows) in enumerate(mine):
            lse_b = rows * LSE_VALUES * FP32
            # The k sums and maxima (two LSE buffers, by chunk: fd.h:196-197).
            dep = [bar] + ([scales[ci - 2]] if ci >= 2 else [])
            lse = -1
            for _ in range(2 * k):
                lse = prog.add(v, MTE2, mte2(lse_b), l2lat, deps=dep)
            l2_b += 2 * k * lse_b
            part_b = rows * HEAD_DIM * FP32
            loads = []
            for i in range(min(FD_PREFETCH, k)):
                g = len(reduces) + i  # partial buffers alternate over all partials (fd.h:394-417)
                dd = [bar] + ([reduces[g - 2]] if g >= 2 and g - 2 < len(reduces) else [])
                loads.append(prog.add(v, MTE2, mte2(part_b), l2lat, deps=dd))
            scale = prog.add(v, VEC, 2 * vector_cycles(model, rows * LSE_VALUES, 1)
                             + vector_cycles(model, k * rows * LSE_VALUES, FD_SCALE_OPS), 0, deps=[lse])
            scales.append(scale)
            red = -1
            for i in range(k):
                if i >= FD_PREFETCH:  # the reduce two partials back frees the buffer
                    loads.append(prog.add(v, MTE2, mte2(part_b), l2lat, deps=[reduces[-2]]))
                red = prog.add(v, VEC, vector_cycles(model, rows * HEAD_DIM, 1 if i == 0 else 2), 0,
                               deps=[loads[i], scale, red])
                reduces.append(red)
            l2_b += k * part_b
            cast = prog.add(v, VEC, vector_cycles(model, rows * HEAD_DIM, 1), 0, deps=[red, prev_store])
            nb = rows * HEAD_DIM * OUT_BYTES
            prev_store = prog.add(v, MTE3, mte3(nb), l2lat, deps=[cast])
            out_b += nb
    return prog.arrays(), l2_b, out_b


def _stretched(cost: OpCost, offset: int) -> dict:
    """A phase's intervals in its duration's cycles (stretched as intervals._own does), shifted."""
    k = max(1.0, cost.duration_cycles / cost.schedule_cycles) if cost.schedule_cycles else 1.0
    return {n: (np.asarray(s) * k + offset, np.asarray(e) * k + offset) for n, (s, e) in cost.pipe_intervals.items()}


def plan_decode_attention(requests: int, queries_per_request: int, heads: int, kv_len: int, cores: int,
                          dtype: str = "bf16") -> SplitPlan:
    """The split of a decode attention: ``requests`` requests of ``queries_per_request`` tokens x
    ``heads`` rows each, every one over ``kv_len`` cached positions, on ``cores`` AIC: FIA's
    (bf16, fp16), or IFA's for int8 (FIA routes INT8 MLA there, fused_infer_attention_score_tiling_v3.cpp:60-71)."""
    if dtype == "int8":
        return plan_split_ifa(requests, queries_per_request, heads, kv_len, cores, PAGE_POSITIONS)
    return plan_split([kv_len] * requests, queries_per_request * heads, cores, PAGE_POSITIONS)


def decode_attention_cost(model: DieModel, requests: int, queries_per_request: int, heads: int, kv_len: int,
                          dtype: str, cores: int, native: bool = True) -> OpCost:
    """MLA decode attention (FIA's schedule) of ``requests`` requests on ``cores`` clusters:
    the tiles, then the FlashDecode combine if a row was split (its phases)."""
    model.macs_per_cycle(dtype)  # raises for a dtype the cube lacks
    # Refuse a huge op before planning it: at least one block per request, 256 rows and 512
    # positions, and over 100 instructions per block.
    check_size("this decode attention", requests * ceil_div(queries_per_request * heads, 256)
               * ceil_div(kv_len, 512) * 100)
    plan = plan_decode_attention(requests, queries_per_request, heads, kv_len, cores, dtype)
    tiles = attention_tiles_cost(model, plan, dtype, native)
    fd = flash_decode_cost(model, plan, native)
    if fd is None:
        return replace(tiles, op="mla_attention")
    phases = (tiles, fd)
    cycles = tiles.duration_cycles + fd.duration_cycles
    busy = dict(tiles.pipe_busy_cycles)
    for k, v in fd.pipe_busy_cycles.items():
        busy[k] = busy.get(k, 0) + v
    iv = _stretched(tiles, 0)
    for n, (s, e) in _stretched(fd, tiles.duration_cycles).items():
        if n in iv:
            s, e = merge_intervals(np.concatenate([iv[n][0], s]), np.concatenate([iv[n][1], e]), MAX_INTERVALS_PER_PIPE)
        iv[n] = (s, e)
    return OpCost(op="mla_attention", duration_ps=model.cycles_to_ps(cycles), duration_cycles=cycles,
                  aic_cores=tiles.aic_cores, aiv_cores=tiles.aiv_cores, pipe_busy_cycles=MappingProxyType(busy),
                  hbm_read_byte=tiles.hbm_read_byte + fd.hbm_read_byte,
                  hbm_write_byte=tiles.hbm_write_byte + fd.hbm_write_byte,
                  l2_hit_byte=tiles.l2_hit_byte + fd.l2_hit_byte, macs=tiles.macs,
                  cube_peak_macs_per_cycle=tiles.cube_peak_macs_per_cycle, phases=phases,
                  pipe_intervals=MappingProxyType(iv), schedule_cycles=cycles)
