"""The memory budget of a run (docs/model.md, "Memory"): what a run will hold at its peak,
estimated before it starts from the trace's counts (``estimate_memory``) and the binned series'
rows at the least (``series_lower_bound``), checked against ``--max-memory`` before the run, as
the event queue and link counters grow during it (``cmemu.run.pipeline.simulate``), and after it
before the HBM series are made (``check_series_rows``). A run that would pass the limit fails
with MemoryLimitError instead of swapping.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cmemu.errors import CmemuError
from cmemu.lower import Lowered
from cmemu.options import DEFAULT_DETAIL, DEFAULT_PIPE_INTERVALS
from cmemu.results.hbm import hbm_series_rows
from cmemu.results.limits import MAX_PIPE_TASK_ROWS
from cmemu.results.result import RunResult
from cmemu.topology import Topology
from cmemu.units import format_bytes


# Memory estimate (docs/model.md, "Memory"): bytes per item, measured with tracemalloc on this
# implementation and rounded up. Parsing a JSON trace builds Python objects of 9 to 13 times the
# file's size; the checked nodes take about 560 B each once the parsed document is dropped.
BASELINE_BYTES = 256 * 2**20  # the interpreter, numpy, Numba, h5py, the largest preset's topology
PARSE_BYTES_PER_FILE_BYTE = 16
NODE_BYTES = 640
OP_BYTES = 400  # lowered per-op arrays, engine state, timeline rows and the op's name
COMP_BYTES = 400  # a COMP the die model times: its pipe-occupancy rows (up to 7), lowering to /tasks
# Its pipe busy intervals (up to 6 pipes x --pipe-intervals, at most MAX_PIPE_TASK_ROWS in all):
# 33 B per /tasks row, and what a kernel fills them from (cmemu.die.intervals.op_rows).
PIPE_ROW_BYTES = 50
EDGE_BYTES = 40  # a dependency: its CSR entry plus the lowering's edge lists
MESSAGE_BYTES = 200  # lowered (22 B) and engine (8 B) per-message arrays, the columns they are built from
# A collective's internal ops and messages: no trace node, no /ops or /messages row, built in
# blocks of their final size (cmemu/lower/builder.py). At the end of the EP320 decode step's run
# (5 to 61 layers): an op about 90 B lowered, 64 B OpInfo, 8 B message list, 40 B HBM sharing
# for half of them; a message 22 B lowered and 8 B in the engine (its packets to come and its
# place in its op's list; no delivery time is kept). Rounded up.
INNER_OP_BYTES = 200
INNER_MESSAGE_BYTES = 40
INNER_EDGE_BYTES = 12  # their CSR entry (4 B), laid straight into place
LINK_BYTES = 200  # topology, fabric and engine per-link arrays, VOQ heads and tails
PACKET_BYTES = 48  # one live packet in the engine's pool
TRAFFIC_BYTES = 4  # per packet: the binned link counters, which grow with the traffic
EVENT_BYTES = 32  # one pending event in the native heap or FIFO (time, seq, kind, two ids)
# The pure-Python reference holds the same state in lists of Python ints and tuples.
REFERENCE_FACTOR = 3
REFERENCE_PACKET_BYTES = 600  # a live packet there is a Python object with a dozen int fields
# --detail packets keeps a record of every packet's transmission on every link. Before the run
# they are counted as packets x PACKET_RECORD_LINKS (a UB packet between nodes crosses die -> L1
# -> L2 -> L1 -> die; within a node two links, so this is an upper bound for writes; a read's
# request and response each count). Each takes 40 B in the engine, 33 B in the arrays
# packet_records() returns, and PACKET_ROW_BYTES as /packets columns before they are written.
PACKET_RECORD_LINKS = 4
PACKET_ROW_BYTES = 37  # start_ps, end_ps 8 B; link, msg, op, seq, wire_bytes 4 B; type 1 B
PACKET_RECORD_BYTES = 40 + 33 + PACKET_ROW_BYTES
PACKET_RECORDS_WARN = 1_000_000  # above: a warning on stderr with the estimate
PACKET_RECORDS_MAX = 50_000_000  # above: refused before the run (--detail tasks instead)
# The time-binned series (/links/binned, /dies/hbm_binned, /dies/hbm_stack_binned) grow with the
# simulated time over the bin width: bytes per row, from the engine's rows (16 B a link row) and
# the result's columns to the writer's row order and checks. Before the run, the rows the traffic
# must fill at the least are counted (series_lower_bound); during it, the link rows the engine
# holds (between slices, with the event queue); after it, the HBM rows exactly (hbm_series_rows)
# before they are made.
LINK_SERIES_ROW_BYTES = 48
HBM_SERIES_ROW_BYTES = 64  # a (die, bin) row
HBM_STACK_ROW_BYTES = 64  # a (die, stack, bin) row


class MemoryLimitError(CmemuError):
    """A run would need more memory than --max-memory allows."""


@dataclass(frozen=True)
class MemoryEstimate:
    """What a run will hold at its peak, in bytes, by part (docs/model.md, "Memory")."""

    trace_bytes: int
    arrays_bytes: int
    event_queue_bytes: int
    ops: int
    messages: int
    packets: int
    live_packets: int
    packet_records: int = 0  # --detail packets: transmissions of a packet on a link (estimated)
    records_bytes: int = 0  # what those records take in memory
    routing_bytes: int = 0  # the MoE collectives' token routing (cmemu.workload.moe.moe_routing_bytes)
    series_rows: int = 0  # rows of the binned series the traffic fills at the least (series_lower_bound)
    series_bytes: int = 0  # what they take

    @property
    def total_bytes(self) -> int:
        return (BASELINE_BYTES + self.trace_bytes + self.arrays_bytes + self.event_queue_bytes + self.records_bytes
                + self.routing_bytes + self.series_bytes)

    def describe(self) -> str:
        records = (f", packet records {format_bytes(self.records_bytes)} for about "
                   f"{self.packet_records:,} records" if self.packet_records else "")
        if self.routing_bytes:
            records += f", MoE routing {format_bytes(self.routing_bytes)}"
        if self.series_rows:
            records += (f", binned series {format_bytes(self.series_bytes)} for at least {self.series_rows:,} rows "
                        "(--link-bin-ns sets their bins)")
        return (f"{self.ops:,} ops, {self.messages:,} messages ({self.packets:,} packets, at most "
                f"{self.live_packets:,} in flight) need about {format_bytes(self.total_bytes)} "
                f"(trace {format_bytes(self.trace_bytes)}, arrays and timeline "
                f"{format_bytes(self.arrays_bytes)}, event queue {format_bytes(self.event_queue_bytes)}"
                f"{records})")


def _pipes_of(op) -> int:
    """Pipes of /tasks a COMP op can have intervals on (cmemu/die): a generic op streams on
    MTE2 and computes on one unit; a GEMM uses the AIC's four; vector ops the AIV's three;
    attention both."""
    if op is None:
        return 2
    if op in ("gemm", "grouped_gemm"):
        return 4
    return 6 if op.startswith("mla") else 3


def _intervals_of(die, attrs: dict, pipe_intervals: int) -> int:
    """Busy intervals a COMP op can have per pipe in /tasks: at most ``pipe_intervals``; a generic
    op (no ``cmemu.op``) streams its bytes in chunks (cmemu.die.kernels.generic_chunks), one
    interval per pipe each at most."""
    if "cmemu.op" in attrs:
        return int(pipe_intervals)
    from cmemu.die.kernels import generic_chunks
    from cmemu.die.ops import unit_cores

    unit, cores, _total = unit_cores(die, attrs)
    chunks = generic_chunks(die, unit, attrs.get("tensor_size", 0), max(1, int(cores)))[2]
    return min(int(pipe_intervals), chunks)


def estimate_memory(trace, topo: Topology, native: bool = True,
                    pipe_intervals: int = DEFAULT_PIPE_INTERVALS, detail: str = DEFAULT_DETAIL) -> MemoryEstimate:
    """Peak memory of replaying a loaded trace, from its counts of ops, dependencies and messages.

    Packets do not scale it: the engine makes them as it injects them, and each endpoint has at
    most ``ub.max_outstanding_packets`` in flight. Every op, link, endpoint and packet
    in flight can have one event pending at once, and the queue's storage grows by doubling.
    The binned link counters grow with the traffic and the simulated time: a few bytes per
    packet stand for them. With ``detail="packets"`` the engine also keeps a record of every
    packet on every link it crosses (PACKET_RECORD_LINKS per packet, PACKET_RECORD_BYTES each).
    """
    from cmemu.lower.collectives import ub_chunk_byte
    from cmemu.workload.moe import moe_routing_bytes

    spec = topo.spec
    ops = len(trace.nodes)
    edges = messages = packets = comps = pipe_slots = inner_ops = inner_messages = inner_edges = 0
    mtu = {"ub": spec.ub.transport_mtu_byte, "rdma": spec.rdma.mtu_byte, "vpc": spec.vpc.mtu_byte}
    groups = trace.header.get("groups", {})
    chunk = ub_chunk_byte(spec.die)
    routings = {}  # each distinct MoE routing: (its pairs' bytes, its scratch while drawn)
    # What a node adds below follows from its type and attributes alone, and the loader shares
    # one attrs dict among the nodes of one type and attributes: once per shape, times its nodes.
    shapes = {}  # (type, id(attrs)) -> [attrs, nodes]
    for node in trace.nodes:
        edges += len(node.data_deps) + len(node.ctrl_deps) + 1
        shape = shapes.get((node.type, id(node.attrs)))
        if shape is None:
            shapes[(node.type, id(node.attrs))] = [node.attrs, 1]
        else:
            shape[1] += 1
    for (ntype, _), (a, k) in shapes.items():
        if ntype == "COMM_SEND":
            messages += k
            packets += k * max(1, -(-a["comm_size"] // mtu[a.get("cmemu.plane", "ub")]))
        elif ntype == "COMP":
            comps += k
            if "cmemu.duration_ns" not in a:
                pipe_slots += k * _pipes_of(a.get("cmemu.op")) * _intervals_of(spec.die, a, pipe_intervals)
        elif ntype == "COMM_COLL":
            # A member's internal ops and messages (cmemu/lower/collectives.py): per (token,
            # expert) pair a load share and a write for MoE, per destination its pieces otherwise,
            # and a flag to and from every other member.
            g = len(groups.get(a["cmemu.group"], ())) or 2
            if "cmemu.tokens" in a:
                experts = a.get("cmemu.experts", g)
                key = (a["cmemu.tokens"], a["cmemu.top_k"], experts, g, a.get("cmemu.skew"), a.get("cmemu.seed"))
                if key not in routings:
                    total = moe_routing_bytes(a["cmemu.tokens"], a["cmemu.top_k"], experts, g)
                    pairs = g * a["cmemu.tokens"] * min(a["cmemu.top_k"], experts) * 8
                    routings[key] = (pairs, total - pairs)
                writes = a["cmemu.tokens"] * a["cmemu.top_k"]
                size = a.get("cmemu.payload_bytes", 2 * a["cmemu.hidden"])
                if a.get("cmemu.engine", "aiv") == "aiv":
                    # The fused kernels (cmemu/lower/moe.py): per AIV a stream of writes and its
                    # tail, per token of a combine a receive and a sum, a flag per (token, k) of
                    # a combine and per expert of a dispatch, the normal kernels' count exchange.
                    cores = a.get("cmemu.cores", spec.die.aiv_cores)
                    inner_ops += k * (4 * cores + 2 * a["cmemu.tokens"] + 16)
                    inner_edges += k * (4 * cores + 4 * a["cmemu.tokens"] + 16)
                    inner_messages += k * (writes + max(a.get("cmemu.experts", g), 2 * g))
                else:
                    batches = min(writes, g)  # SDMA: a descriptor per destination
                    inner_ops += k * (2 * batches + 8)
                    inner_edges += k * (3 * batches + 8)
            else:
                pieces = max(1, -(-a.get("comm_size", 0) // chunk))
                writes = 2 * g * pieces
                size = min(a.get("comm_size", 0), chunk)
                inner_ops += k * (2 * writes + 4 * g)
                inner_edges += k * (3 * writes + 4 * g)
            inner_messages += k * (writes + g)
            packets += k * (writes * max(1, -(-size // spec.ub.transport_mtu_byte)) + g)
    live = min(packets, topo.num_endpoints * spec.ub.max_outstanding_packets)
    pipe_rows = min(pipe_slots, MAX_PIPE_TASK_ROWS)
    arrays = (ops * OP_BYTES + comps * COMP_BYTES + pipe_rows * PIPE_ROW_BYTES + edges * EDGE_BYTES
              + messages * MESSAGE_BYTES + inner_ops * INNER_OP_BYTES + inner_messages * INNER_MESSAGE_BYTES
              + inner_edges * INNER_EDGE_BYTES
              + topo.num_links * LINK_BYTES + 2 * live * PACKET_BYTES + packets * TRAFFIC_BYTES)
    # A message has no event of its own (its start, delivery and ack are not events).
    queue = 2 * (ops + inner_ops + live + topo.num_links + topo.num_endpoints) * EVENT_BYTES
    if not native:
        arrays = arrays * REFERENCE_FACTOR + live * REFERENCE_PACKET_BYTES
        queue *= REFERENCE_FACTOR
    records = packets * PACKET_RECORD_LINKS if detail == "packets" else 0
    records_bytes = records * PACKET_RECORD_BYTES * (1 if native else REFERENCE_FACTOR)
    # The lowering keeps the last 16 routings (moe_routing's cache) and draws one at a time.
    kept = sorted((pairs for pairs, _ in routings.values()), reverse=True)[:16]
    routing = sum(kept) + max((scratch for _, scratch in routings.values()), default=0)
    return MemoryEstimate(len(trace.nodes) * NODE_BYTES, arrays, queue, ops + inner_ops, messages + inner_messages,
                          packets, live,
                          records, records_bytes, routing_bytes=routing)


def series_lower_bound(lowered: Lowered, fabric, bin_ps: int, die_spec) -> tuple[int, int, int]:
    """Rows the binned series must hold at the least, before a run: (link rows, HBM rows per
    die, HBM rows per stack).

    A link is busy at most a whole bin per bin, so the messages' bytes at the fastest link's rate
    fill at least that many (link, bin) rows. On a die, its ops' HBM bytes at twice its HBM
    capacity (its fastest stream), and each of its ops alone (an op runs at least its own
    duration, and its bytes spread over every bin of it), fill at least that many (die, bin)
    rows; an op with at least a period of the interleave plus a byte per bin for every stack
    fills a row per stack in each of its bins."""
    if bin_ps <= 0:
        return 0, 0, 0
    link = 0.0
    if lowered.num_messages:
        link = float(lowered.bytes_sum(np.float64)) * 1e12 / (float(fabric.link_rate_byte_per_s.max()) * bin_ps)
    cap = lowered.die_hbm_byte_per_s
    has = np.flatnonzero(lowered.op_hbm_bytes > 0)
    if not cap.size or not has.size:
        return int(min(link, 2**62)), 0, 0
    dies = cap.size
    die = lowered.op_rank[has].astype(np.int64)
    nbytes = lowered.op_hbm_bytes[has].astype(np.float64)
    per_die = np.bincount(die, weights=nbytes, minlength=dies)[:dies] * 1e12 / (2.0 * np.maximum(cap, 1) * bin_ps)
    bins = np.maximum(1, -(-lowered.op_dur_ps[has] // bin_ps)).astype(np.float64)
    longest = np.zeros(dies)
    np.maximum.at(longest, die, bins)
    die_rows = np.maximum(per_die, longest)
    from cmemu.die.hbm import HBMParams

    hp = HBMParams.from_die(die_spec)
    stacks, period = hp.stacks, float(hp.pseudo_channels * hp.granule_byte)  # a period visits every stack
    spread = np.where(nbytes >= stacks * (period + bins), stacks, 1) * bins
    widest = np.zeros(dies)
    np.maximum.at(widest, die, spread)
    stack_rows = np.maximum(die_rows, widest)
    return int(min(link, 2**62)), int(min(die_rows.sum(), 2**62)), int(min(stack_rows.sum(), 2**62))


def series_bytes(link_rows: int, hbm_rows: int, stack_rows: int | None = None) -> int:
    """Memory of binned series of these rows (per-stack rows: as many as the per-die ones if not given)."""
    stack_rows = hbm_rows if stack_rows is None else stack_rows
    return link_rows * LINK_SERIES_ROW_BYTES + hbm_rows * HBM_SERIES_ROW_BYTES + stack_rows * HBM_STACK_ROW_BYTES


def series_advice(bin_ps: int) -> str:
    return (f"widen the bins (--link-bin-ns, now {bin_ps / 1000:g} ns) or turn them off (--link-bin-ns 0), "
            "or raise --max-memory")


def check_packet_records(need: MemoryEstimate, limit_bytes: int, where: str = "", stream=None) -> None:
    """--detail packets is for small runs: warn on stderr above PACKET_RECORDS_WARN records,
    refuse (CmemuError, before the run) above PACKET_RECORDS_MAX or when the whole run with its
    records would pass the memory limit."""
    n = need.packet_records
    if not n:
        return
    prefix = f"{where}: " if where else ""
    size = (f"about {n:,} packet records (~{format_bytes(need.records_bytes)} in memory, "
            f"~{format_bytes(n * PACKET_ROW_BYTES)} of /packets before compression)")
    if n > PACKET_RECORDS_MAX or need.total_bytes > limit_bytes:
        why = (f"more than the limit of {PACKET_RECORDS_MAX:,} records" if n > PACKET_RECORDS_MAX else
               f"the run would need about {format_bytes(need.total_bytes)}, more than the memory limit "
               f"of {format_bytes(limit_bytes)}")
        raise MemoryLimitError(f"{prefix}--detail packets would keep {size}: {why}; --detail packets is "
                               "for small runs: use --detail tasks (per-link counters stay in /links/binned)")
    if n > PACKET_RECORDS_WARN:
        out = stream if stream is not None else sys.stderr
        out.write(f"cmemu: warning: {prefix}--detail packets will keep {size}; "
                  "--detail tasks keeps per-link counters only\n")
        out.flush()


def check_need(need: MemoryEstimate, limit: int, trace_path, bin_ps: int = 0) -> None:
    if need.total_bytes <= limit:
        return
    advice = "raise --max-memory or split the trace"
    if need.series_bytes > need.total_bytes - need.series_bytes:
        advice = series_advice(bin_ps)
    raise MemoryLimitError(f"{trace_path}: {need.describe()}, more than the memory limit of {format_bytes(limit)}; "
                           + advice)


def check_file_size(path: Path, limit: int) -> None:
    """Refuse, before reading it, a trace whose parsed form alone would pass the limit."""
    try:
        size = path.stat().st_size
    except OSError:
        return  # read_trace reports a missing or unreadable file
    need = BASELINE_BYTES + size * PARSE_BYTES_PER_FILE_BYTE
    if need > limit:
        raise MemoryLimitError(
            f"{path}: reading this {format_bytes(size)} trace needs about {format_bytes(need)}, "
            f"more than the limit of {format_bytes(limit)}; raise --max-memory or split the trace"
        )


def check_series_rows(full: RunResult, left_bytes: int) -> None:
    """After the run, before the HBM series are made: the binned series' rows (the link
    counters', now known, and the HBM series' at most) against what the memory limit leaves
    them (MemoryLimitError)."""
    bin_ps = int(full.link_series["bin_ps"]) if full.link_series is not None else 0
    if bin_ps <= 0:
        return
    link_rows = int(len(full.link_series["bin"]))
    die_rows, stack_rows = hbm_series_rows(full, bin_ps)
    need = series_bytes(link_rows, die_rows, stack_rows)
    if need > left_bytes:
        raise MemoryLimitError(
            f"the run's binned series would hold {link_rows:,} link rows and up to {die_rows + stack_rows:,} HBM rows "
            f"over {full.sim_end_ps / 1e6:,.3f} us of simulated time (about {format_bytes(need)}), more than the "
            f"{format_bytes(max(left_bytes, 0))} the memory limit leaves them; " + series_advice(bin_ps))
