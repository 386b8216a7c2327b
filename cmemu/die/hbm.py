"""HBM of one die: stacks x channels x pseudo-channels, each with banks, rows and a data bus.

Modelled (docs/machine.md 2.3, timings of [DS3] in ns, bursts scaled to the pin rate): every pseudo-
channel (PC) is an independent server with ``bank_groups x banks`` banks, an open-page row
buffer per bank, and one data bus moving ``burst_length`` beats of ``width / 2`` bits per burst.
Physical addresses interleave over the PCs in ``hbm_interleave_byte`` granules; inside a PC,
consecutive granules fill a row (column), then move to the next bank group, then bank, then row.

A PC serves its requests in arrival order (a request is the part of one access that falls into
one granule: 1..granule/32 bursts). Row miss: PRE (after tRAS, tRTP or tWR of the bank) + tRP,
then ACT (after tRRD since the last ACT and at most 4 ACTs in tFAW), then tRCD to the first column
command; the controller opens rows up to ``hbm_queue_requests`` requests ahead (bank-level
parallelism). Data follows a read command after CL, a write after CWL; the bus turns around
after tRTW (read -> write) or tWTR (write data -> read command). Every tREFI all banks are closed
and the PC is blocked for tRFC (all-bank refresh). Achieved bandwidth is what comes out of this:
there is no efficiency factor anywhere.

Left out: power-down, per-bank refresh, ECC, the controller's reordering beyond row-open
look-ahead. Each op is timed alone here; ops running at once on a die share its HBM at run
time, in the engine (docs/model.md, "HBM shared between concurrent ops").
``pc_schedule`` is the Numba kernel; ``pc_schedule.py_func`` its pure-Python reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import njit

# Indices into the integer timing table the kernel reads (all in ps, except QUEUE).
(T_BURST, T_CL, T_CWL, T_RCD, T_RP, T_RAS, T_RRD, T_FAW, T_WR, T_RTP, T_WTR, T_RTW, T_RFC,
 T_REFI, T_QUEUE, T_BANKS) = range(16)


def _ps(ns: float) -> int:
    return int(round(ns * 1000))


@dataclass(frozen=True)
class HBMParams:
    """The die's HBM compiled to integers (ps and bytes): what the kernel needs, nothing else."""

    pseudo_channels: int
    banks: int
    bank_groups: int
    burst_byte: int
    row_byte: int
    granule_byte: int
    write_batch: int
    read_latency_fabric_ps: int
    write_latency_fabric_ps: int
    pin_peak_byte_per_s: float
    timing: tuple  # indexed by T_*
    stacks: int = 1  # PCs are numbered stack by stack: PC p is on stack p // (pseudo_channels // stacks)

    @classmethod
    def from_die(cls, die) -> "HBMParams":
        # A pseudo-channel is half a channel wide; a burst is burst_length beats of that width.
        pc_width_byte = die.hbm_channel_width_bit // die.hbm_pseudo_channels_per_channel // 8
        burst_byte = pc_width_byte * die.hbm_burst_length
        burst_ps = round(die.hbm_burst_length * 1e3 / die.hbm_pin_rate_gbit_per_s)
        banks = die.hbm_bank_groups * die.hbm_banks_per_group
        timing = [0] * 16
        timing[T_BURST] = burst_ps
        for idx, ns in ((T_CL, die.hbm_tcl_ns), (T_CWL, die.hbm_tcwl_ns), (T_RCD, die.hbm_trcd_ns),
                        (T_RP, die.hbm_trp_ns), (T_RAS, die.hbm_tras_ns), (T_RRD, die.hbm_trrd_ns),
                        (T_FAW, die.hbm_tfaw_ns), (T_WR, die.hbm_twr_ns), (T_RTP, die.hbm_trtp_ns),
                        (T_WTR, die.hbm_twtr_ns), (T_RTW, die.hbm_trtw_ns), (T_RFC, die.hbm_trfc_ns),
                        (T_REFI, die.hbm_trefi_ns)):
            timing[idx] = _ps(ns)
        timing[T_QUEUE] = die.hbm_queue_requests
        timing[T_BANKS] = banks
        cycle_ps = 1e6 / die.ai_core_clock_mhz
        # [CYC]'s latencies are what a core sees for one burst on an idle, closed-row HBM: the
        # fabric and controller part is what is left after tRCD + CL (CWL) + one burst.
        rd_fabric = round(die.hbm_read_latency_cycles * cycle_ps) - (timing[T_RCD] + timing[T_CL] + burst_ps)
        wr_fabric = round(die.hbm_write_latency_cycles * cycle_ps) - (timing[T_RCD] + timing[T_CWL] + burst_ps)
        if rd_fabric < 0 or wr_fabric < 0:
            from cmemu.errors import SpecError

            raise SpecError("die.hbm_read_latency_cycles and die.hbm_write_latency_cycles must be at least the DRAM "
                            f"timings they include (tRCD + CL or CWL + one burst), got read "
                            f"{die.hbm_read_latency_cycles}, write {die.hbm_write_latency_cycles} cycles")
        return cls(
            pseudo_channels=die.hbm_pseudo_channels,
            banks=banks,
            bank_groups=die.hbm_bank_groups,
            burst_byte=burst_byte,
            row_byte=die.hbm_row_byte,
            granule_byte=die.hbm_interleave_byte,
            write_batch=die.hbm_write_batch_requests,
            read_latency_fabric_ps=rd_fabric,
            write_latency_fabric_ps=wr_fabric,
            pin_peak_byte_per_s=die.hbm_pin_peak_byte_per_s,
            timing=tuple(timing),
            stacks=die.hbm_stacks,
        )

    @property
    def pc_peak_byte_per_s(self) -> float:
        return self.burst_byte * 1e12 / self.timing[T_BURST]

    def timing_array(self) -> np.ndarray:
        return np.asarray(self.timing, dtype=np.int64)


@njit(cache=True)
def pc_schedule(bank, row, is_write, bursts, arrive_ps, timing):
    """Serve one pseudo-channel's requests in order; returns (data end ps, row hits, refreshes).

    bank, row: int64[n]; is_write: uint8[n]; bursts: int64[n] (>= 1); arrive_ps: int64[n], the
    time each request reaches the controller; timing: int64 table indexed by T_* (ps).
    """
    n = bank.shape[0]
    burst = timing[0]
    t_cl = timing[1]
    t_cwl = timing[2]
    t_rcd = timing[3]
    t_rp = timing[4]
    t_ras = timing[5]
    t_rrd = timing[6]
    t_faw = timing[7]
    t_wr = timing[8]
    t_rtp = timing[9]
    t_wtr = timing[10]
    t_rtw = timing[11]
    t_rfc = timing[12]
    t_refi = timing[13]
    queue = timing[14]
    nbanks = timing[15]
    open_row = np.full(nbanks, -1, dtype=np.int64)
    col_ready = np.zeros(nbanks, dtype=np.int64)  # first column command after ACT + tRCD
    pre_ok = np.zeros(nbanks, dtype=np.int64)  # earliest PRE: tRAS, tRTP, tWR
    faw = np.full(4, -(1 << 40), dtype=np.int64)  # the last four ACTs (ring)
    faw_pos = 0
    last_act = -(1 << 40)
    bus_free = 0
    last_write_end = -(1 << 40)
    last_dir = 0
    blocked = 0  # refresh: nothing issues before this
    next_refresh = t_refi
    refreshes = 0
    hits = 0
    col_cmd = np.zeros(n, dtype=np.int64)
    done = np.empty(n, dtype=np.int64)
    for j in range(n):
        t0 = arrive_ps[j]
        if j >= queue and col_cmd[j - queue] > t0:
            t0 = col_cmd[j - queue]  # the request enters the queue when an older one leaves it
        if t0 < blocked:
            t0 = blocked
        # All-bank refresh when it falls due: banks precharge, the PC is blocked for tRFC.
        while (bus_free if bus_free > t0 else t0) >= next_refresh:
            r = next_refresh if next_refresh > bus_free else bus_free
            for b in range(nbanks):
                if open_row[b] >= 0 and pre_ok[b] > r:
                    r = pre_ok[b]
            for b in range(nbanks):
                open_row[b] = -1
            blocked = r + t_rp + t_rfc
            next_refresh += t_refi
            refreshes += 1
            if t0 < blocked:
                t0 = blocked
        b = bank[j]
        w = is_write[j]
        if open_row[b] == row[j]:
            hits += 1
        else:
            act = t0
            if open_row[b] >= 0:
                pre = pre_ok[b] if pre_ok[b] > t0 else t0
                act = pre + t_rp
            if act < last_act + t_rrd:
                act = last_act + t_rrd
            if act < faw[faw_pos] + t_faw:
                act = faw[faw_pos] + t_faw
            faw[faw_pos] = act
            faw_pos = (faw_pos + 1) % 4
            last_act = act
            open_row[b] = row[j]
            col_ready[b] = act + t_rcd
            pre_ok[b] = act + t_ras
        cmd = col_ready[b] if col_ready[b] > t0 else t0
        lat = t_cwl if w else t_cl
        data_min = bus_free
        if w and not last_dir and j > 0:
            data_min = bus_free + t_rtw
        if (not w) and last_dir:
            if cmd < last_write_end + t_wtr:
                cmd = last_write_end + t_wtr
        if cmd + lat < data_min:
            cmd = data_min - lat
        data_end = cmd + lat + bursts[j] * burst
        col_cmd[j] = cmd
        bus_free = data_end
        last_dir = w
        if w:
            last_write_end = data_end
            if data_end + t_wr > pre_ok[b]:
                pre_ok[b] = data_end + t_wr
        else:
            last_cmd = cmd + (bursts[j] - 1) * burst
            if last_cmd + t_rtp > pre_ok[b]:
                pre_ok[b] = last_cmd + t_rtp
        done[j] = data_end
    return done, hits, refreshes


def map_granules(hp: HBMParams, granule_index: np.ndarray):
    """(pseudo-channel, bank, row) of global granule indices: PC interleave, then column, bank
    group, bank, row inside the PC."""
    g = np.asarray(granule_index, dtype=np.int64)
    pc = g % hp.pseudo_channels
    local = g // hp.pseudo_channels
    per_row = max(1, hp.row_byte // hp.granule_byte)
    r = local // per_row
    banks_in_group = hp.banks // hp.bank_groups
    group = r % hp.bank_groups
    bank_in_group = (r // hp.bank_groups) % banks_in_group
    bank = group * banks_in_group + bank_in_group
    row = r // hp.banks
    return pc, bank, row


def stack_of_pc(hp: HBMParams, pc):
    """The stack a pseudo-channel belongs to. PCs are numbered channel by channel and channels
    stack by stack (PC p is in channel p // PCs-per-channel, and stack p // PCs-per-stack)."""
    return np.asarray(pc, dtype=np.int64) // (hp.pseudo_channels // hp.stacks)


def stack_bytes(hp: HBMParams, nbytes, base_byte: int = 0) -> np.ndarray:
    """Bytes of a contiguous region of ``nbytes`` starting at ``base_byte`` that fall on each
    stack: int64 ``[len(nbytes), stacks]``, each row summing to its ``nbytes``.

    From the interleave (``map_granules``): granule g goes to PC g % PCs, so one *period* of
    PCs x granule bytes (32 KiB for 64 PCs of 512 B) visits every PC once, and stack s owns the
    contiguous ``PCs-per-stack x granule`` bytes at offset ``s x PCs-per-stack x granule`` of
    every period. A region therefore gives each stack the same bytes per whole period it covers;
    only its part period, at most one period's bytes, can be uneven. Exact for any size, in
    closed form (no per-granule loop), for regions of any length.
    """
    nbytes = np.asarray(nbytes, dtype=np.int64)
    per_stack = hp.pseudo_channels // hp.stacks * hp.granule_byte  # a stack's share of a period
    period = per_stack * hp.stacks
    lo = np.int64(base_byte) + np.zeros_like(nbytes)
    hi = lo + nbytes
    s = np.arange(hp.stacks, dtype=np.int64)[None, :]

    def below(x):
        # bytes of stack s in [0, x): whole periods, then the part of the last one
        x = x[:, None]
        return x // period * per_stack + np.clip(x % period - s * per_stack, 0, per_stack)

    return below(hi) - below(lo)


def _pc_requests(hp: HBMParams, kind: str, access_byte: int, pattern: str, n_access: int, seed: int):
    """Requests that reach pseudo-channel 0 for a stream of accesses (all queued at time 0).

    kind: "read", "write" or "copy" (a read stream and a write stream to another region, writes
    drained in batches of ``write_batch``); pattern: "sequential" or "random" (each access at a
    random access-aligned address of a 1 GiB region).
    """
    gran = hp.granule_byte
    rng = np.random.default_rng(seed)
    span = 1 << 30
    if pattern == "sequential":
        base = np.arange(n_access, dtype=np.int64) * access_byte
    else:
        slots = max(1, span // max(access_byte, gran))
        base = rng.integers(0, slots, size=n_access, dtype=np.int64) * max(access_byte, gran)
    # Split each access into granule pieces: (granule index, bytes in it).
    first = base // gran
    last = (base + access_byte - 1) // gran
    counts = last - first + 1
    idx = np.repeat(first, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    lo = np.maximum(idx * gran, np.repeat(base, counts))
    hi = np.minimum((idx + 1) * gran, np.repeat(base + access_byte, counts))
    starts, sizes = idx, hi - lo
    streams = [(starts, sizes, 0)]
    if kind == "write":
        streams = [(starts, sizes, 1)]
    elif kind == "copy":
        streams = [(starts, sizes, 0), (starts + (span // gran) * 2, sizes, 1)]
    # Bursts a piece touches: from the burst holding its first byte to the one holding its last.
    off_lo = lo - idx * gran
    off_hi = hi - idx * gran
    bursts_of_piece = (off_hi - 1) // hp.burst_byte - off_lo // hp.burst_byte + 1
    parts = []
    for g, s, w in streams:
        pc, bank, row = map_granules(hp, g)
        keep = pc == 0
        parts.append((bank[keep], row[keep], np.full(int(keep.sum()), w, dtype=np.uint8),
                      bursts_of_piece[keep], s[keep]))
    if len(parts) == 1:
        bank, row, w, b, useful = parts[0]
    else:
        # Interleave the read and the write stream in batches (the controller drains writes).
        (rb, rr, rw, rbu, rs), (wb, wr, ww, wbu, ws) = parts
        k = hp.write_batch
        order = []
        nr, nw = len(rb), len(wb)
        i = 0
        while i < max(nr, nw):
            order.extend(("r", j) for j in range(i, min(i + k, nr)))
            order.extend(("w", j) for j in range(i, min(i + k, nw)))
            i += k
        bank = np.array([rb[j] if s == "r" else wb[j] for s, j in order], dtype=np.int64)
        row = np.array([rr[j] if s == "r" else wr[j] for s, j in order], dtype=np.int64)
        w = np.array([0 if s == "r" else 1 for s, j in order], dtype=np.uint8)
        b = np.array([rbu[j] if s == "r" else wbu[j] for s, j in order], dtype=np.int64)
        useful = np.array([rs[j] if s == "r" else ws[j] for s, j in order], dtype=np.int64)
    return (np.ascontiguousarray(bank, dtype=np.int64), np.ascontiguousarray(row, dtype=np.int64),
            np.ascontiguousarray(w, dtype=np.uint8), np.ascontiguousarray(b, dtype=np.int64),
            int(np.sum(useful)))


@dataclass(frozen=True)
class StreamResult:
    bandwidth_byte_per_s: float  # the whole die (all pseudo-channels alike)
    row_hit_fraction: float
    refreshes: int
    window_ps: int


def stream(hp: HBMParams, kind: str = "read", access_byte: int = 512, pattern: str = "sequential",
           window_ns: float = 20_000.0, native: bool = True, seed: int = 0) -> StreamResult:
    """Saturated streaming: enough accesses queued to keep pseudo-channel 0 busy for about
    ``window_ns`` at peak; by symmetry every PC does the same, so the die's achieved bandwidth is
    PC 0's bytes / time x the number of PCs."""
    return _stream_cached(hp, kind, int(access_byte), pattern, float(window_ns), native, seed)


@lru_cache(maxsize=256)
def _stream_cached(hp, kind, access_byte, pattern, window_ns, native, seed):
    pc_bytes = hp.pc_peak_byte_per_s * window_ns * 1e-9
    per_access_pc0 = max(access_byte / hp.pseudo_channels, min(access_byte, hp.granule_byte) / hp.pseudo_channels)
    n_access = int(max(64, pc_bytes / per_access_pc0 / (2 if kind == "copy" else 1)))
    bank, row, w, b, useful = _pc_requests(hp, kind, access_byte, pattern, n_access, seed)
    if len(bank) == 0:
        return StreamResult(0.0, 0.0, 0, 0)
    arrive = np.zeros(len(bank), dtype=np.int64)
    fn = pc_schedule if native else pc_schedule.py_func
    done, hits, refreshes = fn(bank, row, w, b, arrive, hp.timing_array())
    # Useful bytes: what the accesses asked for (bursts also carry bytes nobody asked for).
    window = int(done.max())
    return StreamResult(useful / (window * 1e-12) * hp.pseudo_channels, hits / len(bank), int(refreshes), window)


def access_latency_ps(hp: HBMParams, nbytes: int, write: bool = False, native: bool = True) -> int:
    """Time from issue to the last byte of one isolated access on an idle HBM (rows closed):
    the fabric latency plus the busiest pseudo-channel's service of its granules."""
    if nbytes <= 0:
        return 0
    gran = hp.granule_byte
    n_gran = -(-nbytes // gran)
    g = np.arange(n_gran, dtype=np.int64)
    sizes = np.full(n_gran, gran, dtype=np.int64)
    sizes[-1] = nbytes - gran * (n_gran - 1)
    pc, bank, row = map_granules(hp, g)
    keep = pc == 0  # PC 0 holds the most granules of an access that starts at address 0
    bursts = -(-sizes[keep] // hp.burst_byte)
    k = int(keep.sum())
    fn = pc_schedule if native else pc_schedule.py_func
    done, _, _ = fn(bank[keep].copy(), row[keep].copy(), np.full(k, int(write), dtype=np.uint8),
                    bursts, np.zeros(k, dtype=np.int64), hp.timing_array())
    fabric = hp.write_latency_fabric_ps if write else hp.read_latency_fabric_ps
    return int(fabric + done.max())
