"""The HBM time series of a run: each op's HBM bytes spread over its run, per die, HBM stack and
time bin (``hbm_series``), and how many rows they take before they are made (``hbm_series_rows``,
for the run's memory check).
"""
from __future__ import annotations

import numpy as np

from cmemu.errors import SimulationError
from cmemu.results.result import RunResult
from cmemu.vocab import OP_KIND_MEM


def hbm_series_rows(full: RunResult, bin_ps: int) -> tuple[int, int]:
    """Rows hbm_series makes, before it makes them: (per-die rows at most, per-stack rows at
    most), from the HBM ops' times (a die's rows are at most its range of bins, and at most the
    bins its ops touch; a (die, bin) row has at most a row per stack). Raises SimulationError
    when a bin's number would pass an int32 (the file's)."""
    L = full.lowered
    has = np.flatnonzero(L.op_hbm_bytes > 0)
    if not has.size:
        return 0, 0
    start = full.op_start_ps[has]
    end = np.maximum(start, full.op_end_ps[has] - np.where(L.op_kind[has] == OP_KIND_MEM, L.op_lat_ps[has], 0))
    first = start // bin_ps
    last = np.maximum(end - 1, start) // bin_ps
    if int(last.max()) > 2**31 - 1:
        raise SimulationError(f"the run has more than 2**31 HBM counter bins of {bin_ps / 1000:g} ns: make them wider "
                              "(cmemu run --link-bin-ns)")
    dies = int(L.die_aic_cores.shape[0])
    die = L.op_rank[has].astype(np.int64)
    lo = np.full(dies, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(dies, -1, dtype=np.int64)
    np.minimum.at(lo, die, first)
    np.maximum.at(hi, die, last)
    touched = np.bincount(die, weights=(last - first + 1).astype(np.float64), minlength=dies)
    busy = hi >= 0
    cells = int(np.minimum(hi[busy] - lo[busy] + 1, touched[busy]).sum())
    return cells, cells * int(full.spec.die.hbm_stacks)


# hbm_series spreads the dies a group at a time, of at most about this many (op, stack) intervals.
HBM_SPREAD_INTERVALS = 1_000_000


def hbm_series(full: RunResult) -> tuple[dict | None, dict | None]:
    """Each op's HBM bytes spread over its run, per die, stack and bin (the link counters' bins):
    (per-die series, per-stack series). Evenly in time, or, for an op that shared its die's HBM,
    as it progressed at the share it got (``cmemu._core.binning``). The bytes of an op go to the stacks as the
    address interleave puts a contiguous region (``cmemu.die.hbm.stack_bytes``); the trace gives no
    addresses, so a die's ops take regions one after the other, in op order. The per-die series is
    the per-stack one summed, so both agree."""
    from cmemu._core import hbm_sharing
    from cmemu._core.binning import bin_by_die, clock_tables
    from cmemu.die.hbm import HBMParams, stack_bytes
    from cmemu.results.columns import lexsort_order

    if full.link_series is None:
        return None, None
    L = full.lowered
    bin_ps = int(full.link_series["bin_ps"])
    hp = HBMParams.from_die(full.spec.die)
    stacks = hp.stacks
    dies = int(L.die_aic_cores.shape[0])
    # The ops with HBM bytes by die, in op order within a die: die d's are ops[ptr[d]:ptr[d + 1]].
    has = np.flatnonzero(L.op_hbm_bytes > 0)
    ops = has[lexsort_order((L.op_rank[has],))]  # a counting sort: the dies are few
    ptr = np.zeros(dies + 1, dtype=np.int64)
    np.cumsum(np.bincount(L.op_rank[has], minlength=dies)[:dies], out=ptr[1:])
    del has
    start = full.op_start_ps[ops]
    # A MEM op's bytes move before its access latency, which ends it.
    end = full.op_end_ps[ops] - np.where(L.op_kind[ops] == OP_KIND_MEM, L.op_lat_ps[ops], 0)
    np.maximum(start, end, out=end)
    # An op that shared its die's HBM moved its bytes at the speed its share gave it (full speed
    # alone or below the die's level): by its demand and the die's share records.
    shared_ops = shared_demand = clock = None
    if full.hbm_clock is not None and len(full.hbm_clock["die"]):
        if full.hbm_shared_ops is not None and full.hbm_shared_demand is not None:
            # The engine's (op durations and cores may be gone: drop_engine_inputs).
            shared_ops, shared_demand = full.hbm_shared_ops, full.hbm_shared_demand
        else:
            rate = hbm_sharing(L)[1]
            shared_ops = np.flatnonzero(rate > 0)
            shared_demand = rate[shared_ops]
            del rate
        clock = clock_tables(full.hbm_clock, dies)
    period = hp.pseudo_channels * hp.granule_byte

    def stack_share(a, b):
        # Regions one after the other per die (a bump allocator over its ops, in op order), split
        # over the stacks: [ops, stacks]. Rows a:b hold whole dies.
        nbytes = L.op_hbm_bytes[ops[a:b]]
        part = (nbytes % period).astype(np.int64)
        base = np.cumsum(part) - part  # the bytes before each op, of its die's and earlier dies' ops
        lo = ptr[(ptr >= a) & (ptr < b)] - a  # each die's first row
        base -= np.repeat(base[lo], np.diff(np.append(lo, b - a)))
        base %= period
        return stack_bytes(hp, nbytes, base)

    # Each row's demand (0: the op did not share), by a table over the ops: a search per row
    # cost 0.2 s of the 61-layer decode step's 2.4 M rows.
    row_demand = np.zeros(0)
    if shared_ops is not None:
        by_op = np.zeros(L.num_ops, dtype=np.float64)
        by_op[shared_ops] = shared_demand
        row_demand = by_op[ops]
        del by_op

    def demand_of(a, b):
        return row_demand[a:b]

    def clock_of(a, b):
        return np.where(row_demand[a:b] > 0, L.op_rank[ops[a:b]], -1)

    # A die's cells depend on its own ops only: the dies are spread a group at a time, so that the
    # per-(op, stack) bytes of a big run are never all in memory at once.
    cols = bin_by_die(ptr, start, end, stack_share, bin_ps, clock_of=None if clock is None else clock_of,
                      clock=clock, group_rows=max(1, HBM_SPREAD_INTERVALS // stacks), demand=demand_of)
    per_stack = {"bin_ps": bin_ps, "stacks": stacks, "die": cols[0], "stack": cols[1], "bin": cols[2],
                 "bytes": cols[3]}
    per_die = {"bin_ps": bin_ps, "die": cols[4], "bin": cols[5], "bytes": cols[6]}
    return per_die, per_stack
