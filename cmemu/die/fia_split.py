"""How CANN's FusedInferAttentionScore (FIA) MLA template cuts a decode attention into work and
shares it among the AI cores (its host-side tiling), for ``cmemu.die.fia_mla``.

Sources: hicann/ops-transformer at c29bc106 (2025-11-15), read for this model, not copied:
``attention/common/op_host/split_core.h`` (SplitCore, SplitFD), and
``attention/common/op_host/arch32/fia_tiling_nonquant_mla.cpp`` / ``.h`` (CalcMBaseSize,
CalcInnerSize). File:line references below are to those files at that commit.

What it decides, for requests of ``rows_per_request`` query rows (query tokens x heads, one KV
head: MLA) over their cached positions:

- the M tile: ``M_BASE`` = 256 rows, lowered to rows / split when the requests do not divide the
  core count and an even cut of every request's rows into ``split`` tiles of 128-256 rows makes
  the work items a multiple of the cores (``m_tile_rows``);
- the KV (S2) tile: 512 positions, cut to a multiple of the page size if it does not divide 512,
  and never longer than the longest request (``s2_tile_positions``);
- work blocks (request, M tile, S2 tile) in that order, each costing
  6 per 16 rows + 10 per 64 positions (``block_cost``; every block costs 10 when there are no
  more blocks than cores);
- a contiguous range of blocks per core, from a greedy fill (whole requests, then whole M rows,
  then single blocks, each while the core stays within half a block of its share of what is
  left), tried for every core count from sqrt(blocks) to the cores available, keeping the one
  with the smallest largest per-core cost (``split_blocks``);
- FlashDecode: a row (request, M tile) whose blocks land on k > 1 cores is combined afterwards
  from k partial results; the combine's 8-row chunks go to the AIVs by ``split_combine``.

``plan_split_ifa`` is the older IFA rule FIA routes INT8 MLA to.

Left out: sliding-window attention (FIA's banded split), requests with no cached positions,
several KV heads (MLA has one); for IFA, unequal lengths (its balanced and sparse splits).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

M_BASE = 256  # mBaseSize (fia_tiling_nonquant_mla.h:96)
M_BASE_MIN = 128  # the smallest M tile CalcMBaseSize picks (fia_tiling_nonquant_mla.cpp:229)
S2_BASE = 512  # sInnerSize_ (fia_tiling_nonquant_mla.cpp:166)
# Block cost: 6 per 16 rows + 10 per 64 KV positions, both rounded up (split_core.h:194-201);
# every block costs 10 when there are no more blocks than cores (split_core.h:433, 461-466).
COST_PER_ROWS, ROWS_UNIT = 6, 16
COST_PER_POSITIONS, POSITIONS_UNIT = 10, 64
UNIT_COST = 10
FD_CHUNK_ROWS = 8  # rows per FlashDecode combine chunk, mFdBaseSize_ (fia_tiling_nonquant_mla.h:97)
MAX_SPLIT_RATIO = 2  # SplitFD's tolerance (split_core.h:22)


def block_cost(rows: int, positions: int) -> int:
    """FIA's cost of a work block of ``rows`` query rows over ``positions`` KV positions."""
    return COST_PER_ROWS * (-(-rows // ROWS_UNIT)) + COST_PER_POSITIONS * (-(-positions // POSITIONS_UNIT))


def m_tile_rows(requests: int, rows_per_request: int, cores: int, same_lengths: bool) -> int:
    """The M tile (CalcMBaseSize, fia_tiling_nonquant_mla.cpp:199-234): 256 rows, unless the
    requests do not divide the cores, all requests have the same KV length, and cutting each
    request's rows into split = lcm(requests, cores) / requests equal tiles gives tiles of 128 to
    256 rows: then that tile (and requests x split work items, a multiple of the cores)."""
    if requests % cores == 0 or not same_lengths:
        return M_BASE
    split = math.lcm(requests, cores) // requests
    if rows_per_request % split:
        return M_BASE
    rows = rows_per_request // split
    return rows if M_BASE_MIN <= rows <= M_BASE else M_BASE


def s2_tile_positions(max_kv_len: int, page_positions: int) -> int:
    """The KV tile (CalcInnerSize, fia_tiling_nonquant_mla.cpp:164-197): 512 positions, rounded
    down to whole pages when a page is shorter than 512 and does not divide it; at most the
    longest request's paged length (pages x page size, fia_tiling_info_parser.cpp:513)."""
    s2 = S2_BASE
    if s2 > page_positions and s2 % page_positions:
        s2 = s2 // page_positions * page_positions
    paged_max = -(-max_kv_len // page_positions) * page_positions
    return min(s2, paged_max)


@dataclass(frozen=True)
class FDHead:
    """A row (request, M tile) split over ``splits`` cores: combined from that many partials."""

    request: int
    m_tile: int
    rows: int
    splits: int

    @property
    def chunks(self) -> int:
        return -(-self.rows // FD_CHUNK_ROWS)


@dataclass(frozen=True)
class SplitPlan:
    """Work blocks and their cores. Block i (in request, M tile, S2 tile order) has
    ``request[i]``, ``m_tile[i]``, ``s2_tile[i]``, ``rows[i]`` query rows and ``positions[i]``
    KV positions from position ``first[i]`` of its request; core c runs blocks ``starts[c]`` to
    ``starts[c + 1] - 1``."""

    m_base: int
    s2_base: int
    request: np.ndarray
    m_tile: np.ndarray
    s2_tile: np.ndarray
    rows: np.ndarray
    positions: np.ndarray
    first: np.ndarray
    cost: np.ndarray  # per block
    starts: np.ndarray  # per used core, and the end
    fd_heads: tuple  # FDHead per split row, in block order
    combine: tuple  # per combining AIV: ((fd head index, chunk index), ...)

    @property
    def cores_used(self) -> int:
        return len(self.starts) - 1

    @property
    def blocks_per_core(self) -> np.ndarray:
        return np.diff(self.starts)

    @property
    def cost_per_core(self) -> np.ndarray:
        c = np.concatenate([[0], np.cumsum(self.cost)])
        return c[self.starts[1:]] - c[self.starts[:-1]]

    @property
    def max_splits(self) -> int:
        return max((h.splits for h in self.fd_heads), default=1)


def _blocks(kv_lens, rows_per_request: int, m_base: int, s2_base: int, cores: int):
    """The work blocks in order (request, M tile, S2 tile) as arrays, and their costs
    (CalSplitBatchInfo, split_core.h:431-476)."""
    lens = np.asarray(kv_lens, dtype=np.int64)
    n_rows = -(-rows_per_request // m_base)  # M tiles per request
    n_s2 = -(-lens // s2_base)  # S2 tiles per request
    per_req = n_rows * n_s2
    n = int(per_req.sum())
    req = np.repeat(np.arange(len(lens)), per_req)
    local = np.arange(n) - np.repeat(np.cumsum(per_req) - per_req, per_req)
    nb = n_s2[req]
    m_tile, s2_tile = local // nb, local % nb
    rows = np.minimum(m_base, rows_per_request - m_tile * m_base)
    positions = np.minimum(s2_base, lens[req] - s2_tile * s2_base)
    if n > cores:
        cost = COST_PER_ROWS * (-(-rows // ROWS_UNIT)) + COST_PER_POSITIONS * (-(-positions // POSITIONS_UNIT))
    else:
        cost = np.full(n, UNIT_COST, dtype=np.int64)
    return req, m_tile, s2_tile, rows, positions, cost.astype(np.int64)


def _fill(cost, prefix, req_end, row_end, n_cores: int):
    """GetBlockNumOnCore (split_core.h:305-429): fill ``n_cores`` cores in order, each up to its
    share of the cost still unassigned. Blocks are flat indices; ``req_end[i]`` and
    ``row_end[i]`` end block i's request and row (exclusive), ``prefix`` sums the costs.
    Returns (blocks per core, largest per-core cost)."""
    n = len(cost)
    i = 0
    unassigned = prefix[n]
    counts = []
    worst = 0
    core = 0
    while unassigned > 0 and core < n_cores:
        limit = unassigned // (n_cores - core)
        start = i
        cur = 0
        done = False
        # 1. Whole (rest of) requests while within half the request's last block.
        while limit + cost[req_end[i] - 1] // 2 >= cur + prefix[req_end[i]] - prefix[i]:
            cur += prefix[req_end[i]] - prefix[i]
            i = req_end[i]
            if i == n:
                done = True
                break
        if not done:
            # 2. Whole (rest of) rows, never the request's last, within half the row's last block.
            while row_end[i] != req_end[i] and limit + cost[row_end[i] - 1] // 2 >= cur + prefix[row_end[i]] - prefix[i]:
                cur += prefix[row_end[i]] - prefix[i]
                i = row_end[i]
            # 3. Single blocks of this row, within half a block (at least one), not past its end.
            end = row_end[i]
            while i < end and (i == start or limit + cost[i] // 2 >= cur + cost[i]):
                cur += cost[i]
                i += 1
        counts.append(i - start)
        worst = max(worst, cur)
        unassigned -= cur
        core += 1
    return counts, worst


def split_blocks(req, m_tile, cost, cores: int):
    """SplitCore (split_core.h:564-616): the blocks per used core with the smallest largest
    per-core cost over the core counts from round(sqrt(blocks)) to ``cores`` (ties: the fewer
    cores)."""
    n = len(cost)
    row = req * (int(m_tile.max()) + 1) + m_tile
    new_req = np.r_[True, req[1:] != req[:-1]]
    new_row = np.r_[True, row[1:] != row[:-1]]
    idx = np.arange(n)
    # End (exclusive) of each block's request and row: the next start at or after it.
    req_starts = np.r_[idx[new_req], n]
    row_starts = np.r_[idx[new_row], n]
    req_end = req_starts[np.searchsorted(req_starts, idx, side="right")].tolist()
    row_end = row_starts[np.searchsorted(row_starts, idx, side="right")].tolist()
    prefix = np.concatenate([[0], np.cumsum(cost)]).tolist()
    cost_l = cost.tolist()
    hi = min(cores, n)
    lo = min(int(math.sqrt(n + 0.25) + 0.5), hi)
    best = None
    for k in range(lo, hi + 1):
        counts, worst = _fill(cost_l, prefix, req_end, row_end, k)
        if best is None or worst < best[1]:
            best = (counts, worst)
    return best[0]


def split_combine(heads, cores_used: int) -> tuple:
    """SplitFD (split_core.h:735-773): the FlashDecode combine's 8-row chunks, in order, to at
    most 2 x ``cores_used`` AIVs; a chunk's load is its head's splits. An AIV takes chunks while
    a chunk's load is at most twice the room left under the mean load still to share."""
    total = sum(h.splits * h.chunks for h in heads)
    n_chunks = sum(h.chunks for h in heads)
    if not n_chunks:
        return ()
    n_vec = min(n_chunks, 2 * cores_used)
    thr = total / n_vec
    load = 0
    out = [[]]
    for i, h in enumerate(heads):
        for c in range(h.chunks):
            if h.splits > (thr - load) * MAX_SPLIT_RATIO:
                total -= load
                left = n_vec - len(out)
                thr = total / left if left > 0 else math.inf
                out.append([])
                load = 0
            load += h.splits
            out[-1].append((i, c))
    return tuple(tuple(v) for v in out)


def plan_split(kv_lens, rows_per_request: int, cores: int, page_positions: int,
               m_base: int | None = None) -> SplitPlan:
    """FIA's whole split for requests with ``kv_lens`` cached positions each (>= 1) and
    ``rows_per_request`` query rows each, on ``cores`` AICs."""
    kv_lens = [int(x) for x in kv_lens]
    if not kv_lens or min(kv_lens) < 1 or rows_per_request < 1 or cores < 1:
        raise ValueError("FIA's split needs requests with >= 1 cached position, >= 1 query row and >= 1 core")
    if m_base is None:
        m_base = m_tile_rows(len(kv_lens), rows_per_request, cores, len(set(kv_lens)) == 1)
    s2_base = s2_tile_positions(max(kv_lens), page_positions)
    req, mt, st, rows, pos, cost = _blocks(kv_lens, rows_per_request, m_base, s2_base, cores)
    counts = split_blocks(req, mt, cost, cores)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    # FlashDecode heads (ReconSplitPlan, RecordFDInfo: split_core.h:280-303, 478-562): rows
    # whose blocks lie on more than one core, with that number of cores.
    row_id = req * (int(mt.max()) + 1) + mt
    core_of = np.repeat(np.arange(len(counts)), counts)
    first = np.flatnonzero(np.r_[True, row_id[1:] != row_id[:-1]])
    # A row's cores: 1 + the core changes between consecutive blocks of the row.
    inside = np.r_[0, ((core_of[1:] != core_of[:-1]) & (row_id[1:] == row_id[:-1])).astype(np.int64)]
    cores_of_row = 1 + np.add.reduceat(inside, first)
    heads = tuple(FDHead(int(req[a]), int(mt[a]), int(rows[a]), int(k)) for a, k in zip(first, cores_of_row) if k > 1)
    return SplitPlan(m_base, s2_base, req, mt, st, rows, pos, st * s2_base, cost, starts, heads,
                     split_combine(heads, len(counts)))


# IFA's rule for INT8 MLA (incre_flash_attention_tiling.cpp, _tiling_check.cpp): FIA routes
# INT8 KV to IFA (fused_infer_attention_score_tiling_v3.cpp:60-71), whose full-quant MLA template
# splits whole query units over the cores, or, for few requests, each request's KV into equal
# parts (FlashDecode).
IFA_M_ROWS = 128  # gMax_: query rows per unit (incre_flash_attention_tiling_impl.h:448)
IFA_FD_REQUEST_RATIO = 0.5  # FlashDecode if requests <= 0.5 x cores (_tiling_check.cpp:1032-1037)
IFA_FD_MIN_POSITIONS = 2048  # ... and (heads > 1) at least this long (_tiling_check.cpp:1044-1047)
IFA_MIN_SPLIT_POSITIONS = 512  # fewer parts while a part would be shorter (_tiling.cpp:2253)


def plan_split_ifa(requests: int, queries_per_request: int, heads: int, kv_len: int, cores: int,
                   page_positions: int) -> SplitPlan:
    """IFA's split of ``requests`` requests of ``queries_per_request`` tokens x ``heads`` rows,
    all over ``kv_len`` positions (BSND layout, equal lengths), on ``cores`` AICs.

    Units are (request, group of 128 // heads query tokens) (SplitUnbalanced, _tiling.cpp:
    1990-2025). FlashDecode when one query token per request, at most 128 heads, requests <= 0.5
    x cores and (heads == 1 or kv_len >= 2048) (IsFlashDecode, _tiling_check.cpp:990-1050): each
    request's positions in cores // requests parts (fewer while a part would be under 512
    positions), of ceil(kv_len / parts) rounded up to whole pages, one core each (SplitBNS,
    _tiling.cpp:2246-2268); the KV tile is 512, 128 for 256-position parts, 256 for parts of 257
    to 512 (CalcInnerSize, _tiling.cpp:2296-2318). Otherwise whole units in contiguous equal
    counts on the fewest cores with the same largest count (SplitBN_V0, _tiling.cpp:2211-2244).
    A FlashDecode request is combined on one AIV (ifa_mla.h:1635-1662)."""
    if min(requests, queries_per_request, heads, kv_len, cores) < 1:
        raise ValueError("IFA's split needs >= 1 request, query, head, position and core")
    paged = -(-kv_len // page_positions) * page_positions
    per_unit = max(1, min(IFA_M_ROWS // heads, queries_per_request))
    n_units = -(-queries_per_request // per_unit)
    unit_rows = [min(per_unit, queries_per_request - u * per_unit) * heads for u in range(n_units)]
    fd = (queries_per_request == 1 and heads <= IFA_M_ROWS and requests <= IFA_FD_REQUEST_RATIO * cores
          and (heads == 1 or kv_len >= IFA_FD_MIN_POSITIONS))
    req, mt, st, rows, pos, first, counts, heads_fd = [], [], [], [], [], [], [], []
    if fd:
        parts = cores // requests
        while kv_len // parts < IFA_MIN_SPLIT_POSITIONS and parts > 1:
            parts -= 1
        part_len = -(-(-(-paged // parts)) // page_positions) * page_positions
        s2 = min(128 if part_len == 256 else (256 if 256 < part_len <= S2_BASE else S2_BASE), part_len)
        for b in range(requests):
            used = 0
            for p in range(parts):
                lo, hi = p * part_len, min((p + 1) * part_len, kv_len)
                if lo >= hi:
                    break
                n = -(-(hi - lo) // s2)
                for t in range(n):
                    req.append(b)
                    mt.append(0)
                    st.append(t)
                    rows.append(unit_rows[0])
                    pos.append(min(s2, hi - lo - t * s2))
                    first.append(lo + t * s2)
                counts.append(n)
                used += 1
            if used > 1:
                heads_fd.append(FDHead(b, 0, unit_rows[0], used))
    else:
        s2 = s2_tile_positions(kv_len, page_positions)
        bn = requests * n_units
        n_cores = -(-bn // -(-bn // cores))
        base, extra = divmod(bn, n_cores)
        per_core = [base + 1] * extra + [base] * (n_cores - extra)
        n_tiles = -(-kv_len // s2)
        for b in range(requests):
            for u in range(n_units):
                for t in range(n_tiles):
                    req.append(b)
                    mt.append(u)
                    st.append(t)
                    rows.append(unit_rows[u])
                    pos.append(min(s2, kv_len - t * s2))
                    first.append(t * s2)
        counts = [c * n_tiles for c in per_core if c]
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    combine = tuple(tuple((i, c) for c in range(h.chunks)) for i, h in enumerate(heads_fd))
    n = len(req)
    return SplitPlan(IFA_M_ROWS, s2, np.asarray(req, dtype=np.int64), np.asarray(mt, dtype=np.int64),
                     np.asarray(st, dtype=np.int64), np.asarray(rows, dtype=np.int64), np.asarray(pos, dtype=np.int64),
                     np.asarray(first, dtype=np.int64), np.full(n, UNIT_COST, dtype=np.int64), starts,
                     tuple(heads_fd), combine)
