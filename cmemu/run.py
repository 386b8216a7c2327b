"""Replaying a trace: spec -> topology -> validated trace -> lowering -> engine -> timeline.

``run_trace`` is what ``cmemu run`` calls and what Python users call. The engine runs in slices
of events so that long runs can report progress without any Python call per event.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cmemu._core import make_engine
from cmemu.errors import CmemuError, DieFailedError, SimulationError, UnroutableError
from cmemu.fabric import FABRIC_MODELS, build_fabric
from cmemu.faults import parse_failures
from cmemu.lower import Lowered, lower
from cmemu.options import (
    DEFAULT_COMPRESSION,
    DEFAULT_DETAIL,
    DEFAULT_FABRIC,
    DEFAULT_LINK_BIN_NS,
    DEFAULT_PIPE_INTERVALS,
)
from cmemu.spec import DEFAULT_SYSTEM, SystemSpec, load_system
from cmemu.topology import Topology, build_topology
from cmemu.trace.read import TraceDocument
from cmemu.units import default_memory_limit, format_bytes, ns_to_ps
from cmemu.vocab import NODE_TYPES, OP_KIND_MEM, OP_KIND_RECV, OP_KIND_SEND

# /tasks: the most rows the die model's busy intervals (DEFAULT_PIPE_INTERVALS per COMP op and pipe)
# may take in all (about 33 B each; the limit per op is halved until they fit).
MAX_PIPE_TASK_ROWS = 4_000_000
EVENTS_PER_SLICE = 1 << 20
PROGRESS_AFTER_S = 2.0
# The engine's clock is an int64 count of picoseconds; a run whose worst case could pass 2**62 ps
# (about 53 days) is refused before it starts rather than wrapping round.
CLOCK_LIMIT_PS = 2**62

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
# A bin is at least the clock's tick (1 ps) and at most the clock's range.
MIN_BIN_NS = 1e-3
MAX_BIN_NS = CLOCK_LIMIT_PS / 1000


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
    for node in trace.nodes:
        edges += len(node.data_deps) + len(node.ctrl_deps) + 1
        if node.type == "COMM_SEND":
            messages += 1
            size = node.attrs["comm_size"]
            packets += max(1, -(-size // mtu[node.attrs.get("cmemu.plane", "ub")]))
        elif node.type == "COMP":
            comps += 1
            if "cmemu.duration_ns" not in node.attrs:
                pipe_slots += _pipes_of(node.attrs.get("cmemu.op")) * _intervals_of(spec.die, node.attrs, pipe_intervals)
        elif node.type == "COMM_COLL":
            # A member's internal ops and messages (cmemu/lower/collectives.py): per (token,
            # expert) pair a load share and a write for MoE, per destination its pieces otherwise,
            # and a flag to and from every other member.
            a = node.attrs
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
                    inner_ops += 4 * cores + 2 * a["cmemu.tokens"] + 16
                    inner_edges += 4 * cores + 4 * a["cmemu.tokens"] + 16
                    inner_messages += writes + max(a.get("cmemu.experts", g), 2 * g)
                else:
                    batches = min(writes, g)  # SDMA: a descriptor per destination
                    inner_ops += 2 * batches + 8
                    inner_edges += 3 * batches + 8
            else:
                pieces = max(1, -(-a.get("comm_size", 0) // chunk))
                writes = 2 * g * pieces
                size = min(a.get("comm_size", 0), chunk)
                inner_ops += 2 * writes + 4 * g
                inner_edges += 3 * writes + 4 * g
            inner_messages += writes + g
            packets += writes * max(1, -(-size // spec.ub.transport_mtu_byte)) + g
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


def check_link_bin_ns(link_bin_ns) -> int:
    """--link-bin-ns (0: off) as the bin width in ps, or a CmemuError: a bin is at least the
    clock's tick (1 ps) and within its range."""
    try:
        value = float(link_bin_ns)
    except (TypeError, ValueError):
        value = math.nan
    if value == 0:
        return 0
    if not MIN_BIN_NS <= value <= MAX_BIN_NS:  # NaN fails
        raise CmemuError(f"--link-bin-ns must be 0 (no binned counters) or from {MIN_BIN_NS:g} ns (1 ps, the "
                         f"clock's tick) to {MAX_BIN_NS:.3g} ns (the clock's range), got {link_bin_ns!r}")
    return ns_to_ps(value)


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


def _series_advice(bin_ps: int) -> str:
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


def check_clock_range(lowered: Lowered, fabric, where: str = "", nodes=None) -> None:
    """Refuse a run whose simulated time could overflow the engine's clock; the message names
    the file (``where``) and the trace node that takes the longest, and its field.

    The end of a run is a chain of activities (op durations, HBM accesses, packet hops), each
    counted once, so the sum of them all bounds it. Float arithmetic: only the order matters.
    """
    L, F = lowered, fabric
    total = float(L.op_dur_ps.sum(dtype=np.float64)) + float(L.op_lat_ps.sum(dtype=np.float64))
    if L.num_messages:
        # Packets: at most one more per message than its bytes over the smallest MTU.
        payload = float(L.bytes_sum(np.float64))
        packets = payload / float(F.path_mtu_byte.min()) + L.num_messages
        wire = payload + packets * float(F.path_header_byte.max() + F.path_flit_byte.max())
        hops = 2 * 4  # a read's request and response, at most four links each
        slowest = float(F.link_rate_byte_per_s.min())
        total += hops * wire * 1e12 / slowest
        per_packet = hops * float(F.link_latency_ps.max()) + float(F.ep_issue_ps.max())
        per_packet += float(F.ep_write_latency_ps.max() + F.ep_read_latency_ps.max())
        startup = float(F.ep_startup_ps.max()) + float(F.ini_msg_startup_ps.max())
        # An AIV's own work before a message (msg_prep) is counted once per message too.
        prep = float(L.msg_prep.max()) if L.msg_prep.size else 0.0
        total += packets * per_packet + L.num_messages * (startup + prep)
    if total > CLOCK_LIMIT_PS:
        raise SimulationError(
            f"{where + ': ' if where else ''}the trace's ops and transfers add up to {total / 86400e12:,.0f} days of "
            f"simulated time in the worst case, beyond what the engine's clock holds (2**62 ps, about 53 days)"
            f"{_longest_op(L, nodes)}")


def _longest_op(L: Lowered, nodes=None) -> str:
    """'; the largest: node N (TYPE, field 'F', ...)', of the trace's ops by time alone or bytes
    (``nodes``: the trace's, to name a COMP's field)."""
    nt = L.num_trace_ops
    if not nt:
        return ""
    # Time of each trace op alone: its duration, or its bytes at 1 B/ps (a message's fastest).
    own = L.op_dur_ps[:nt].astype(np.float64) + L.op_lat_ps[:nt]
    moved = L.op_bytes[:nt].astype(np.float64)
    i = int(np.argmax(np.maximum(own, moved)))
    kind = NODE_TYPES[L.op_type[i]]
    field = {"COMP": "cmemu.duration_ns", "MEM_LOAD": "tensor_size", "MEM_STORE": "tensor_size"}.get(kind, "comm_size")
    if kind == "COMP" and nodes is not None and "cmemu.duration_ns" not in nodes[i].attrs:
        field = "cmemu.op" if "cmemu.op" in nodes[i].attrs else "num_ops"
    if kind == "COMP" and own[i] < moved[i]:
        field = "tensor_size"
    what = f"{own[i] / 86400e12:,.1f} days alone" if own[i] >= moved[i] else f"{int(moved[i]):,} B"
    return f"; the largest: node {L.op_node_id[i]} ({kind}, field '{field}', {what})"


@dataclass
class RunResult:
    """What one replay produced. Times are integer picoseconds."""

    spec: SystemSpec
    topology: Topology
    trace: object
    lowered: Lowered
    op_start_ps: np.ndarray
    op_end_ps: np.ndarray
    link_bytes: np.ndarray
    link_busy_ps: np.ndarray
    events: int
    max_pending_events: int
    wall_time_s: float  # until the results were whole (run_trace: the writing aside, as it can be)
    native: bool
    # Optional records, None until a model produces them (docs/timeline-format.md, v2):
    # tasks: per pipe/engine task columns (cmemu.output.schema.TASK_FIELDS), written to /tasks;
    # link_series: binned link counters, sparse COO {"bin_ps", "link", "bin", "bytes", "busy_ps"}
    # (schema.LINK_SERIES_FIELDS), written to /links/binned.
    tasks: dict | None = None
    link_series: dict | None = None
    msg_packets: np.ndarray | None = None  # int64: packets each message was cut into (as msg_delivered_ps)
    # int64: when each message's last byte was in memory, for the first messages only in a run of a
    # trace (Lowered.leading_trace_messages: the trace's own, the ones /messages holds)
    msg_delivered_ps: np.ndarray | None = None
    packets_sent: int = 0  # packet transmissions, one per packet per link
    packets_lost: int = 0  # packets lost on links that failed during the run (and sent again)
    hbm_series: dict | None = None  # {"bin_ps", "die", "bin", "bytes"}: HBM bytes per die and time bin
    # {"bin_ps", "stacks", "die", "stack", "bin", "bytes"}: the same per HBM stack (sums to hbm_series)
    hbm_stack_series: dict | None = None
    # {"dispatch_op", "combine_op"}: each MOE_COMBINE with the MOE_DISPATCH it returns the tokens of
    moe_pairs: dict | None = None
    pipe_tasks: dict | None = None  # the COMP ops' pipe intervals (pipe_interval_tasks), /tasks rows
    pipe_intervals: int | None = None  # at most this many per COMP op and pipe in pipe_tasks
    # --detail packets: every packet's transmission on every link (schema.PACKET_FIELDS), to /packets
    packets: dict | None = None
    hbm_clock: dict | None = None  # Engine.hbm_clock(): each die's HBM share (its level) after every change
    hbm_shared_ops: np.ndarray | None = None  # Engine.hbm_shared_ops: the ops that shared it
    hbm_shared_demand: np.ndarray | None = None  # Engine.hbm_shared_demand: their demands, bytes/s
    fabric_messages: int = 0  # every message the run moved, collectives' included
    fabric_packets: int = 0
    fabric_bytes: int = 0
    fabric_model: str = "packet"  # cmemu.fabric.FABRIC_MODELS: how messages moved
    retime: object = None  # cmemu.lower.retime.RetimeReport of a run with retime=True
    compile_s: float = 0.0  # of wall_time_s, the time Numba spent compiling kernels (cmemu.kernels; first runs)

    @property
    def sim_end_ps(self) -> int:
        return int(self.op_end_ps.max()) if self.op_end_ps.size else 0


class Progress:
    """A one-line progress report on stderr, shown only once a run has taken a while."""

    def __init__(self, total_ops: int, stream=None, after_s: float = PROGRESS_AFTER_S):
        self.total = total_ops
        self.stream = stream if stream is not None else sys.stderr
        self.after_s = after_s
        self.t0 = time.perf_counter()
        self.shown = False

    def update(self, engine) -> None:
        elapsed = time.perf_counter() - self.t0
        if elapsed < self.after_s:
            return
        self.shown = True
        pct = 100.0 * engine.ops_done / self.total if self.total else 100.0
        rate = engine.events / elapsed / 1e6
        self.stream.write(
            f"\r  simulated {engine.now / 1e6:,.3f} us | ops {engine.ops_done:,}/{self.total:,} "
            f"({pct:.0f}%) | {engine.events:,} events | {rate:.2f} M events/s | {elapsed:.1f} s wall"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def resolve_system(trace_system: str | None, system: str | None, overrides=()) -> SystemSpec:
    """The system named on the command line wins over the trace's header, then the default."""
    return load_system(system or trace_system or DEFAULT_SYSTEM, overrides)


def simulate(lowered: Lowered, fabric, native: bool = True, progress: Progress | None = None,
             queue_limit_bytes: int | None = None, bin_ps: int = 0, record_packets: bool = False,
             record_deliveries: int = -1, drop_engine_inputs: bool = False, failed_parts: str = "--fail"):
    """Run the engine to the end; raise SimulationError if ops stay blocked or time ran back.

    The engine runs in slices of EVENTS_PER_SLICE events. Between slices: progress, and the
    event queue's high-water mark and the binned link counters' rows (with ``bin_ps``) against
    ``queue_limit_bytes``, what the memory limit leaves them (MemoryLimitError above it).
    ``failed_parts`` says where the failed parts come from, for the error of a message left
    without a path.
    A KeyboardInterrupt lands between slices (the native loop holds no Python frame); the
    progress line is closed and the interrupt goes on to the caller.
    ``record_packets`` keeps every packet's transmission on every link (``engine.packet_records()``);
    ``record_deliveries``: keep the delivery times of the first that many messages (-1: all).
    ``drop_engine_inputs``: the lowering's columns the engine has its own copy of are cut as it is
    built (``make_engine(drop_inputs=True)``); only what the results are built from is left.
    """
    engine = make_engine(lowered, fabric, native=native, bin_ps=bin_ps, record_packets=record_packets,
                         record_deliveries=record_deliveries, drop_inputs=drop_engine_inputs)
    per_event = EVENT_BYTES * (1 if native else REFERENCE_FACTOR)
    max_rows = queue_limit_bytes // LINK_SERIES_ROW_BYTES if queue_limit_bytes is not None and bin_ps > 0 else -1
    try:
        while not _run_slice(engine, lowered, fabric, failed_parts, max_rows):
            if progress is not None:
                progress.update(engine)
            if queue_limit_bytes is None:
                continue
            # Storage grows by doubling, so it can hold twice the high-water mark.
            queue = 2 * engine.max_pending * per_event
            rows = engine.series_rows if bin_ps > 0 else 0
            if queue + rows * LINK_SERIES_ROW_BYTES <= queue_limit_bytes:
                # The engine stops a slice early should the link counters pass what is left.
                max_rows = (queue_limit_bytes - queue) // LINK_SERIES_ROW_BYTES if bin_ps > 0 else -1
                continue
            if rows * LINK_SERIES_ROW_BYTES > queue:
                raise MemoryLimitError(
                    f"the binned link counters grew to {rows:,} rows (about "
                    f"{format_bytes(rows * LINK_SERIES_ROW_BYTES)}) by {engine.now / 1e6:,.3f} us of simulated "
                    f"time, more than the {format_bytes(queue_limit_bytes)} the memory limit leaves them; "
                    + _series_advice(bin_ps))
            raise MemoryLimitError(
                f"the event queue grew to {engine.max_pending:,} pending events "
                f"(about {format_bytes(queue)}), more than the "
                f"{format_bytes(queue_limit_bytes)} the memory limit leaves it; "
                "raise --max-memory or split the trace"
            )
    finally:
        if progress is not None:
            progress.close()
    if engine.past_event:
        raise SimulationError("internal invariant broken: an event was scheduled in the past")
    if engine.ops_done != lowered.num_ops:
        raise SimulationError(describe_blocked(lowered, engine))
    if engine.messages_delivered != lowered.num_messages:
        raise SimulationError(f"internal invariant broken: {lowered.num_messages - engine.messages_delivered:,} "
                              "messages were never delivered")
    if engine.packets_live != 0:
        raise SimulationError(f"internal invariant broken: {engine.packets_live} packets never reached their end")
    if not np.array_equal(engine.credit_bytes, np.repeat(fabric.link_credit_byte[:, None], 2, axis=1)):
        raise SimulationError("internal invariant broken: link credits did not all return")
    return engine


def _run_slice(engine, lowered, fabric, failed_parts: str = "--fail", max_series_rows: int = -1) -> bool:
    try:
        return engine.run(EVENTS_PER_SLICE, max_series_rows)
    except DieFailedError as exc:
        op = exc.args[0]
        die = int(lowered.op_rank[op])
        when = int(fabric.fail_time_ps[fabric.fail_die == die].min())
        raise SimulationError(f"{_op_label(lowered, op)} needs die {die}, which failed at "
                              f"{when / 1e6:,.3f} us (the trace's cmemu.faults)") from None
    except UnroutableError as exc:
        src, dst, _, _, _, send, recv = engine.message(exc.args[0])  # (the lowering may have dropped it)
        op = send if send >= 0 else recv
        # An end of the message on a die that failed during the run (a die failed from the start
        # has its ops refused before the run): say so, rather than a route.
        for end, role in ((dst, "its destination"), (src, "its source")):
            down = fabric.fail_time_ps[(fabric.fail_die == end) & (fabric.fail_time_ps <= engine.now)]
            if down.size:
                raise SimulationError(
                    f"a message from die {src} to die {dst} ({_op_label(lowered, op)}) cannot be delivered: "
                    f"die {end}, {role}, failed at {int(down.min()) / 1e6:,.3f} us (the trace's cmemu.faults)"
                ) from None
        raise SimulationError(
            f"a message from die {src} to die {dst} "
            f"({_op_label(lowered, op)}) has no path left: every route crosses a failed part ({failed_parts})"
        ) from None


def _op_label(lowered: Lowered, i: int) -> str:
    if i >= lowered.num_trace_ops:
        parent = int(lowered.op_parent[i])
        return f"an internal op of {_op_label(lowered, parent)}" if parent >= 0 else f"internal op {i}"
    return (f"node {lowered.op_node_id[i]} '{lowered.op_name[i]}' "
            f"({NODE_TYPES[lowered.op_type[i]]}, rank {lowered.op_rank[i]}, stream {lowered.op_stream[i]})")


def check_failed_dies(lowered: Lowered, failures, origin=None) -> None:
    """An op placed on a failed die cannot run: say which, before the run. ``origin``: die ->
    what failed it (default: --fail die:N)."""
    if not failures.dies:
        return
    on_dead = np.flatnonzero(np.isin(lowered.op_rank[:lowered.num_trace_ops], sorted(failures.dies)))
    if on_dead.size:
        i = int(on_dead[0])
        die = int(lowered.op_rank[i])
        more = f" (and {on_dead.size - 1} more ops)" if on_dead.size > 1 else ""
        why = (origin or {}).get(die, f"--fail die:{die}")
        raise SimulationError(f"{_op_label(lowered, i)} needs die {die}, which has failed ({why}){more}")


def describe_blocked(lowered: Lowered, engine, limit: int = 8) -> str:
    """Name the ops that can never finish and why (a receive whose send never ran, ...)."""
    start = np.asarray(engine.op_start_ps)
    end = np.asarray(engine.op_end_ps)
    pending = np.asarray(engine.msg_pending)
    blocked = np.flatnonzero(end < 0)
    lines = []

    def label(i):
        return _op_label(lowered, i)

    # Ops that started but cannot end: receives waiting for a message first, they are the roots.
    for i in blocked:
        if start[i] >= 0 and lowered.op_kind[i] == OP_KIND_RECV:
            # Its messages not yet delivered (a receive may wait for several); the engine's
            # copy of them (the lowering may have dropped a collective's).
            mine = np.asarray(engine.op_messages(int(i)), dtype=np.int64)
            for m in mine[pending[mine] > 0][:limit].tolist():
                src, _, _, _, _, s, _ = engine.message(m)
                if s < 0:  # a read: the receive started it, nobody sends
                    lines.append(f"{label(i)} waits for the data it reads from endpoint {src}")
                    continue
                state = "never started" if start[s] < 0 else "has not delivered it"
                lines.append(f"{label(i)} waits for its message from {label(s)}, which {state}")
    for i in blocked:
        if start[i] < 0 and len(lines) < limit:
            why = "waits for its dependencies"
            if lowered.op_kind[i] == OP_KIND_SEND:
                why = "never started: it waits for its dependencies or the previous op of its stream"
            lines.append(f"{label(i)} {why}")
    shown = lines[:limit]
    more = len(blocked) - len(shown)
    text = f"the run cannot finish: {len(blocked)} of {lowered.num_ops} ops are blocked: " + "; ".join(shown)
    if more > 0:
        text += f"; and {more} more"
    return text


def run_trace(
    trace_path,
    system: str | None = None,
    overrides=(),
    output=None,
    native: bool = True,
    progress: bool | Progress = True,
    max_memory_bytes: int | None = None,
    compression: str = DEFAULT_COMPRESSION,
    detail: str = DEFAULT_DETAIL,
    link_bin_ns: float = DEFAULT_LINK_BIN_NS,
    spec: SystemSpec | None = None,
    fail=(),
    pipe_intervals: int = DEFAULT_PIPE_INTERVALS,
    fabric_model: str = DEFAULT_FABRIC,
    retime: bool = False,
) -> RunResult:
    """Replay a trace file, or a trace in memory (a cmemu.trace.TraceDocument, which the run takes
    over: the scenarios' generated steps need no file); write the HDF5 timeline to ``output``
    when it is given.

    ``spec`` (a resolved SystemSpec) replaces ``system`` and ``overrides`` when given.

    ``fabric_model`` is "packet" (every packet on every link) or "message" (small writes move as
    one unit: cmemu.fabric.FABRIC_MODELS).

    ``max_memory_bytes`` (default: ``default_memory_limit()``) bounds the run: a run whose
    estimate (``estimate_memory``) is above it fails with MemoryLimitError before it starts.

    ``retime``: COMP nodes with both a measured time and a shape are timed by the die model
    (cmemu.lower.retime); the result's ``retime`` reports how the two compare.

    While it runs, numpy's arrays have ordinary pages (``small_pages``).
    """
    with small_pages():
        return _run_trace(trace_path, system, overrides, output, native, progress, max_memory_bytes, compression,
                          detail, link_bin_ns, spec, fail, pipe_intervals, fabric_model, retime)


@contextmanager
def small_pages():
    """numpy asks the kernel for transparent huge pages for every array of 4 MiB and more. A run
    writes gigabytes of new arrays once each; on the development VM the first write to huge pages
    costs 2-4x what it does in 4 KiB pages (2 GB: 3.1-4.4 s against 1.0 s), and the engine reads
    its arrays no faster for them (the 61-layer decode step: about 5 s less end to end). Turned
    off for the block, then as it was; a numpy without the switch is left alone."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # numpy 1.x
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            _set_madvise_hugepage = None
    before = _set_madvise_hugepage(False) if _set_madvise_hugepage is not None else None
    try:
        yield
    finally:
        if _set_madvise_hugepage is not None:
            _set_madvise_hugepage(before)


@dataclass
class PreparedRun:
    """What a run builds and checks before it simulates (``prepare_run``)."""

    spec: SystemSpec
    topology: Topology
    trace: object
    lowered: Lowered
    fabric: object
    need: MemoryEstimate
    limit_bytes: int
    bin_ps: int
    failed_parts: str  # where the failed parts come from, for errors during the run
    retime: object = None  # cmemu.lower.retime.RetimeReport, with retime=True


def prepare_run(trace_path, system: str | None = None, overrides=(), native: bool = True,
                max_memory_bytes: int | None = None, detail: str = DEFAULT_DETAIL, link_bin_ns: float = DEFAULT_LINK_BIN_NS,
                spec: SystemSpec | None = None, fail=(), pipe_intervals: int = DEFAULT_PIPE_INTERVALS,
                fabric_model: str = DEFAULT_FABRIC, retime: bool = False) -> PreparedRun:
    """Everything ``run_trace`` checks and builds before simulating, for ``cmemu run`` and
    ``cmemu trace validate`` alike (``trace_path``: a file, or a TraceDocument, which it takes
    over and frees once checked): the options, the memory the file takes to read, the trace
    (with the system's checks of each node: cores, op sizes, MoE routing), the run's memory
    estimate, the lowering, the fault schedule against the topology, the clock's range, and the
    binned series' rows at the least. Raises the first problem as a CmemuError; a trace's own
    problems as its first TraceError, whose ``problems`` lists them all."""
    from cmemu.lower.checks import node_checker
    from cmemu.trace import load_trace, read_document

    if fabric_model not in FABRIC_MODELS:
        raise CmemuError(f"--fabric must be one of {', '.join(FABRIC_MODELS)}, got {fabric_model!r}")
    if int(pipe_intervals) < 1:
        raise CmemuError(f"--pipe-intervals must be at least 1, got {pipe_intervals}")
    bin_ps = check_link_bin_ns(link_bin_ns)
    limit = default_memory_limit() if max_memory_bytes is None else int(max_memory_bytes)
    if isinstance(trace_path, TraceDocument):
        source = trace_path
    else:
        _check_file_size(Path(trace_path), limit)
        source = read_document(trace_path)
    trace_path = source.name  # what errors name
    read = source.take()
    header_system = read[0].get("system") if isinstance(read[0], dict) else None
    groups = read[0].get("groups") if isinstance(read[0], dict) else None
    if spec is None:
        spec = resolve_system(header_system if isinstance(header_system, str) else None, system, overrides)
    topo = build_topology(spec)
    trace = load_trace(trace_path, num_ranks=spec.dies, read=read, node_check=node_checker(spec, groups, limit))
    del read, groups  # the parsed document: the checked nodes hold all the run needs
    report = None
    if retime:
        from cmemu.lower.retime import retime_trace

        trace, report = retime_trace(trace, spec.die, str(trace_path))
    need = estimate_memory(trace, topo, native=native, pipe_intervals=pipe_intervals, detail=detail)
    check_packet_records(need, limit, trace_path)
    _check_need(need, limit, trace_path)
    record = detail == "packets"
    # The native engine reads only the templates of the collectives' repeated messages and then
    # drops the columns (drop_engine_inputs): their copies need not be written.
    lowered = lower(trace, topo, fill_messages=not native or record)
    failures, schedule, origin, failed_parts = trace_failures(trace, topo, fail)
    check_failed_dies(lowered, failures, origin)
    if schedule and FABRIC_MODELS[fabric_model]:
        raise CmemuError("the message-level fabric (--fabric message) does not model failures during a run; "
                         "use --fabric packet")
    fabric = build_fabric(topo, failures, schedule, model=fabric_model)
    check_clock_range(lowered, fabric, str(trace_path), trace.nodes)
    link_rows, die_rows, stack_rows = series_lower_bound(lowered, fabric, bin_ps, spec.die)
    need = dataclasses.replace(need, series_rows=link_rows + die_rows + stack_rows,
                               series_bytes=series_bytes(link_rows, die_rows, stack_rows))
    _check_need(need, limit, trace_path, bin_ps)
    return PreparedRun(spec, topo, trace, lowered, fabric, need, limit, bin_ps, failed_parts, report)


def _check_need(need: MemoryEstimate, limit: int, trace_path, bin_ps: int = 0) -> None:
    if need.total_bytes <= limit:
        return
    advice = "raise --max-memory or split the trace"
    if need.series_bytes > need.total_bytes - need.series_bytes:
        advice = _series_advice(bin_ps)
    raise MemoryLimitError(f"{trace_path}: {need.describe()}, more than the memory limit of {format_bytes(limit)}; "
                           + advice)


def _run_trace(trace_path, system, overrides, output, native, progress, max_memory_bytes, compression, detail,
               link_bin_ns, spec, fail, pipe_intervals, fabric_model, retime=False) -> RunResult:
    from cmemu.kernels import compile_seconds

    t0, compiling0 = time.perf_counter(), compile_seconds()
    if output is not None:
        from cmemu.output.atomic import check_output
        from cmemu.output.schema import check_compression, check_detail

        check_detail(detail)  # before the run: an unwritable detail level should not cost a run
        check_compression(compression)
        # and neither should a target that cannot be written: a missing or read-only folder, a
        # device file or link, or the trace itself.
        check_output(output, inputs=_input_files(trace_path))
        if isinstance(trace_path, TraceDocument):
            trace_path.sha256  # noqa: B018 (the timeline records it: worked out before the run frees the document)
    inputs = _input_files(trace_path)
    prep = prepare_run(trace_path, system, overrides, native, max_memory_bytes, detail, link_bin_ns, spec, fail,
                       pipe_intervals, fabric_model, retime)
    retime_report = prep.retime
    spec, topo, trace, lowered, fabric, need = prep.spec, prep.topology, prep.trace, prep.lowered, prep.fabric, prep.need
    limit, bin_ps, record, failed_parts = prep.limit_bytes, prep.bin_ps, detail == "packets", prep.failed_parts
    del prep
    prog = progress if isinstance(progress, Progress) else (Progress(lowered.num_ops) if progress else None)
    # What the limit leaves the event queue and the binned link counters (counted as they grow).
    static_bytes = need.total_bytes - need.event_queue_bytes - need.series_bytes
    queue_limit = limit - static_bytes
    # Delivery times are kept for the trace's own messages, what /messages holds.
    # The lowering's columns the engine copies go as it is built (the packet rows of --detail
    # packets name every message: then they stay).
    engine = simulate(lowered, fabric, native=native, progress=prog, queue_limit_bytes=queue_limit, bin_ps=bin_ps,
                      record_packets=record, record_deliveries=lowered.leading_trace_messages(),
                      drop_engine_inputs=not record, failed_parts=failed_parts)
    # Its run state: the rest of the results are built without it (the op times read first).
    hbm_shared_ops, hbm_shared_demand = engine.hbm_shared_ops, engine.hbm_shared_demand
    engine.release(keep_op_times=True)
    op_start, op_end = np.asarray(engine.op_start_ps), np.asarray(engine.op_end_ps)
    engine.release()
    full = RunResult(
        spec=spec,
        topology=topo,
        trace=trace,
        lowered=lowered,
        op_start_ps=op_start,
        op_end_ps=op_end,
        link_bytes=np.asarray(engine.link_bytes),
        link_busy_ps=np.asarray(engine.link_busy_ps),
        events=int(engine.events),
        max_pending_events=int(engine.max_pending),
        wall_time_s=0.0,
        native=native,
        link_series=engine.link_series() if bin_ps else None,
        msg_packets=engine.message_packets(len(engine.msg_delivered_ps)),
        fabric_packets=int(engine.packets_total),
        msg_delivered_ps=np.asarray(engine.msg_delivered_ps),
        packets_sent=int(engine.packets_sent),
        packets_lost=int(getattr(engine, "packets_lost", 0)),
        packets=engine.packet_records() if record else None,
        hbm_clock=engine.hbm_clock(),
        hbm_shared_ops=hbm_shared_ops,
        hbm_shared_demand=hbm_shared_demand,
        fabric_model=fabric_model,
        retime=retime_report,
    )
    del engine  # with record_packets, its copy of the records
    check_invariants(full)
    if bin_ps:
        check_series_rows(full, limit - static_bytes)
    result, hbm = trace_result_hbm_later(full, pipe_intervals)
    del full, lowered, fabric  # the whole lowering: the result keeps its view of the trace's ops
    if output is None:
        result = with_hbm_series(result, hbm.result())
        result.wall_time_s = time.perf_counter() - t0
        result.compile_s = compile_seconds() - compiling0
        return result
    from cmemu.output.hdf5 import write_timeline

    # The file's other groups are written while the HBM series are still being worked out; the
    # run's wall time is to when they were done (its results whole), the writing aside.
    built = time.perf_counter()
    result.wall_time_s = built - t0
    result.compile_s = compile_seconds() - compiling0
    whole = result

    def complete():
        nonlocal whole
        series = hbm.result()
        whole = with_hbm_series(result, series)
        whole.wall_time_s = max(built, series[2]) - t0
        whole.compile_s = compile_seconds() - compiling0
        return whole

    write_timeline(output, result, compression=compression, detail=detail, hbm_later=complete, inputs=inputs)
    return whole


def _input_files(trace) -> tuple:
    """The files a run reads (none for a trace in memory), which its output must not replace."""
    if isinstance(trace, TraceDocument):
        return () if trace.file is None else (trace.file,)
    return (trace,)


def _check_file_size(path: Path, limit: int) -> None:
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


def trace_failures(trace, topo: Topology, fail=()):
    """The failed parts of a run: ``--fail`` (``fail``) and the trace header's ``cmemu.faults``
    ([{"fail": "l2:0.3", "at_ns": 5000}]: from the start when at_ns is 0, else during the run;
    the trace checker has checked their form), each part checked against the topology.
    Returns (Failures from the start, [(time in ps, Failures)] during the run, die -> what
    failed it from the start, a text naming every failed part and where it comes from)."""
    static, timed, origin, named = [], [], {}, []
    for part in fail:
        parse_failures([part], topo)
        named.append(f"--fail {part}")
        if str(part).startswith("die:"):
            origin.setdefault(int(str(part)[4:]), f"--fail {part}")
    for k, entry in enumerate(trace.header.get("cmemu.faults", [])):
        part, at = entry["fail"], entry.get("at_ns", 0)
        one = parse_failures([part], topo, label=f"{trace.path}: header cmemu.faults[{k}] {part!r}")
        if at == 0:
            static.append(part)
            named.append(f"the trace's cmemu.faults: {part} from the start")
            for die in one.dies:
                origin.setdefault(die, f"the trace's cmemu.faults[{k}], from the start")
        else:
            timed.append((ns_to_ps(at), one))
            named.append(f"the trace's cmemu.faults: {part} at {ns_to_ps(at) / 1e6:,.3f} us")
    failures = parse_failures(list(fail) + static, topo)
    shown = "; ".join(named[:4]) + (f"; and {len(named) - 4} more" if len(named) > 4 else "")
    return failures, timed, origin, shown or "--fail"


def hbm_series_rows(full: RunResult, bin_ps: int) -> tuple[int, int]:
    """Rows _hbm_series makes, before it makes them: (per-die rows at most, per-stack rows at
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
            f"{format_bytes(max(left_bytes, 0))} the memory limit leaves them; " + _series_advice(bin_ps))


# _hbm_series spreads the dies a group at a time, of at most about this many (op, stack) intervals.
HBM_SPREAD_INTERVALS = 1_000_000


def _hbm_series(full: RunResult) -> tuple[dict | None, dict | None]:
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

    def demand_of(a, b):
        # Of rows a:b (0: the op did not share); the shared ops are in op order.
        if not shared_ops.size:
            return np.zeros(b - a)
        at = np.minimum(np.searchsorted(shared_ops, ops[a:b]), shared_ops.size - 1)
        return np.where(shared_ops[at] == ops[a:b], shared_demand[at], 0).astype(np.float64)

    def clock_of(a, b):
        return np.where(demand_of(a, b) > 0, L.op_rank[ops[a:b]], -1)

    # A die's cells depend on its own ops only: the dies are spread a group at a time, so that the
    # per-(op, stack) bytes of a big run are never all in memory at once.
    cols = bin_by_die(ptr, start, end, stack_share, bin_ps, clock_of=None if clock is None else clock_of,
                      clock=clock, group_rows=max(1, HBM_SPREAD_INTERVALS // stacks), demand=demand_of)
    per_stack = {"bin_ps": bin_ps, "stacks": stacks, "die": cols[0], "stack": cols[1], "bin": cols[2],
                 "bytes": cols[3]}
    per_die = {"bin_ps": bin_ps, "die": cols[4], "bin": cols[5], "bytes": cols[6]}
    return per_die, per_stack


def pipe_interval_tasks(full: RunResult, max_intervals: int | None = None,
                        max_rows: int | None = None, lead: int = 0) -> tuple[dict, int]:
    """The die model's pipe busy intervals of every COMP op it timed, as /tasks rows (pipe codes
    of ``cmemu.vocab.PIPE_CODE``, times in ps, bytes 0), and the intervals per op and pipe
    they were merged to (``cmemu.die.intervals.op_pipe_intervals``). The first ``lead`` rows are
    left for the caller to fill (bytes 0, the other columns unset).

    At most ``max_intervals`` per op and pipe (``DEFAULT_PIPE_INTERVALS``); if the run would
    then hold more than ``max_rows`` rows (``MAX_PIPE_TASK_ROWS``), the limit is halved until it
    fits or is 1, so that a big run's /tasks stays bounded (a warning says so)."""
    import warnings

    from cmemu.die.intervals import op_pipe_intervals, op_rows
    from cmemu.die.ops import node_cost
    from cmemu.vocab import PIPE_CODE

    n_max = DEFAULT_PIPE_INTERVALS if max_intervals is None else int(max_intervals)
    if n_max < 1:
        raise ValueError(f"pipe intervals per op and pipe must be at least 1, got {n_max}")
    cap = MAX_PIPE_TASK_ROWS if max_rows is None else int(max_rows)
    L = full.lowered
    die = full.spec.die
    op_of = L.pipe_task_op
    if op_of.size and np.all(op_of[1:] >= op_of[:-1]):  # in op order, as the lowering makes them
        ops = op_of[np.flatnonzero(np.concatenate([[True], op_of[1:] != op_of[:-1]]))]
    else:
        ops = np.unique(op_of)
    nodes = full.trace.nodes
    # Ops of one shape share one (memoised) cost: work per distinct cost, then repeat. Nodes with
    # equal attributes share one attrs dict (the loader's), so a cost is looked up once per dict.
    costs, cost_of = [], np.empty(ops.size, dtype=np.int64)
    index, of_attrs = {}, {}
    for k, op in enumerate(ops.tolist()):
        attrs = nodes[op].attrs
        u = of_attrs.get(id(attrs))
        if u is None:
            c = node_cost(die, attrs)
            u = index.get(id(c))
            if u is None:
                u = index[id(c)] = len(costs)
                costs.append(c)
            of_attrs[id(attrs)] = u
        cost_of[k] = u
    del of_attrs
    uses = np.bincount(cost_of, minlength=len(costs))
    cycle_ps = 1e6 / die.ai_core_clock_mhz

    def table(n):
        rows = []
        for c in costs:
            iv = op_pipe_intervals(c, n)
            names = [p for p in iv if p in PIPE_CODE]
            pipe = np.concatenate([np.full(iv[p][0].size, PIPE_CODE[p], dtype=np.uint8) for p in names]) if names \
                else np.zeros(0, np.uint8)
            s = np.concatenate([iv[p][0] for p in names]) if names else np.zeros(0)
            e = np.concatenate([iv[p][1] for p in names]) if names else np.zeros(0)
            # Offsets from the op's start in ps, as every op of this cost shifts them.
            rows.append((pipe, np.round(s * cycle_ps).astype(np.int64), np.round(e * cycle_ps).astype(np.int64)))
        return rows

    rows = table(n_max)
    n = n_max
    while n > 1 and int(sum(len(r[0]) * k for r, k in zip(rows, uses))) > cap:
        n //= 2
        rows = table(n)
    if n < n_max:
        warnings.warn(f"the pipe intervals of {ops.size:,} COMP ops would pass {cap:,} rows at {n_max} per op "
                      f"and pipe; /tasks keeps at most {n} per op and pipe", stacklevel=2)
    return op_rows(ops, cost_of, rows, full.op_start_ps, full.op_end_ps, L.op_rank, lead=lead), n


MOE_PAIR_WALK_LIMIT = 4096  # ops a combine's dependencies are searched through for its dispatch


def moe_pairs(trace) -> dict:
    """Each MOE_COMBINE of the trace with the MOE_DISPATCH whose tokens it brings back: the
    dispatch of the same rank and group (``cmemu.group``) nearest to it through its data and
    control dependencies (breadth first, at most MOE_PAIR_WALK_LIMIT ops; stream order is not
    followed, as a stream may hold the next micro-batch's dispatch before this one's combine).
    A combine with no such dispatch is left out. Rows of the trace's ops, one per pair."""
    from collections import deque

    nodes = trace.nodes
    index = {node.id: i for i, node in enumerate(nodes)}

    def kind(node):
        return node.attrs.get("comm_type") if node.type == "COMM_COLL" else None

    disp, comb = [], []
    for c, node in enumerate(nodes):
        if kind(node) != "MOE_COMBINE":
            continue
        group = node.attrs.get("cmemu.group")
        seen = {c}
        todo = deque([c])
        found = -1
        while todo and found < 0 and len(seen) <= MOE_PAIR_WALK_LIMIT:
            n = nodes[todo.popleft()]
            for d in list(n.data_deps) + list(n.ctrl_deps):
                j = index[d]
                if j in seen:
                    continue
                seen.add(j)
                m = nodes[j]
                if kind(m) == "MOE_DISPATCH" and m.rank == node.rank and m.attrs.get("cmemu.group") == group:
                    found = j
                    break
                todo.append(j)
        if found >= 0:
            disp.append(found)
            comb.append(c)
    return {"dispatch_op": np.asarray(disp, dtype=np.int32), "combine_op": np.asarray(comb, dtype=np.int32)}


def packet_rows(full: RunResult, keep: np.ndarray) -> dict:
    """The engine's packet records (``engine.packet_records()``, messages of the lowering) as
    /packets rows: ``msg`` becomes the row in /messages (-1 for a message a collective made
    inside itself, which /messages does not list) and ``op`` the row in /ops of the trace op
    that moved it (the send of a write, the receive of a read, or the collective)."""
    from cmemu.vocab import MSG_WRITE

    L = full.lowered
    L.fill_messages()
    rec = full.packets
    m = np.asarray(rec["msg"], dtype=np.int64)
    new_id = np.cumsum(keep) - 1
    msg = np.where(keep[m], new_id[m], -1).astype(np.int32) if m.size else np.zeros(0, np.int32)
    # The op that moved each message: a write's send, a read's receive (the other if it has none).
    send, recv = L.msg_send_op.astype(np.int64), L.msg_recv_op.astype(np.int64)
    mover = np.where(L.msg_kind == MSG_WRITE, send, recv)
    mover = np.where(mover >= 0, mover, np.maximum(send, recv))
    nt = L.num_trace_ops
    inner = mover >= nt
    mover[inner] = L.op_parent[mover[inner]]
    rows = {"start_ps": np.asarray(rec["start_ps"], dtype=np.int64), "end_ps": np.asarray(rec["end_ps"], dtype=np.int64),
            "link": np.asarray(rec["link"], dtype=np.int32), "msg": msg,
            "op": mover[m].astype(np.int32), "seq": np.asarray(rec["seq"], dtype=np.int32),
            "wire_bytes": np.asarray(rec["wire_bytes"], dtype=np.int32),
            "type": np.asarray(rec["ptype"], dtype=np.uint8)}
    start = rows["start_ps"]
    if start.size > 1 and np.any(start[1:] < start[:-1]):
        # The message-level fabric records a packet's links when it reserves them, ahead of time.
        order = np.argsort(start, kind="stable")
        rows = {k: v[order] for k, v in rows.items()}
    return rows


def trace_result(full: RunResult, pipe_intervals: int | None = None) -> RunResult:
    """What a user sees of a run: the trace's own ops (a collective's node spans from its entry
    to its exit) and the messages between them; the ops a lowering added become tasks.

    The COMP ops' pipe intervals are ``full.pipe_tasks`` when given, else made here
    (``pipe_interval_tasks``, at most ``pipe_intervals`` per op and pipe) after the collectives'
    internal steps, in the same arrays."""
    result, hbm = trace_result_hbm_later(full, pipe_intervals)
    return with_hbm_series(result, hbm.result())


def trace_result_hbm_later(full: RunResult, pipe_intervals: int | None = None):
    """trace_result, with the HBM series still being worked out on another thread: (the result
    without them, a Future of (hbm_series, hbm_stack_series, time.perf_counter() when they were
    done)); ``with_hbm_series`` completes it.
    The series take 1.5 s of the 61-layer decode step, most of it in kernels that let go of the
    GIL: the rest of the results, and the timeline's other groups, are made meanwhile."""
    from concurrent.futures import ThreadPoolExecutor

    def series():
        return (*_hbm_series(full), time.perf_counter())

    pool = ThreadPoolExecutor(1, thread_name_prefix="cmemu-hbm-series")
    try:
        hbm = pool.submit(series)
    finally:
        pool.shutdown(wait=False)  # its thread ends with the job
    rest = _trace_result_rest(full, pipe_intervals)
    return dataclasses.replace(full, hbm_series=None, hbm_stack_series=None, **rest), hbm


def with_hbm_series(result: RunResult, series: tuple) -> RunResult:
    """The result with its HBM series (trace_result_hbm_later's Future's result)."""
    return dataclasses.replace(result, hbm_series=series[0], hbm_stack_series=series[1])


def _trace_result_rest(full: RunResult, pipe_intervals: int | None) -> dict:
    """trace_result's fields but the HBM series."""
    L = full.lowered
    nt = L.num_trace_ops
    start = full.op_start_ps[:nt].copy()
    spans = np.flatnonzero(L.op_report_start[:nt] >= 0)
    start[spans] = full.op_start_ps[L.op_report_start[spans]]
    view, keep = L.trace_view()
    tasks, n_pipe = full.tasks, full.pipe_intervals
    # The internal steps of collectives (on SDMA / AIV-Direct / VECTOR), then the die model's pipe
    # busy intervals of each COMP op, in one set of arrays.
    inner = np.flatnonzero(L.op_lane[nt:] >= 0) + nt
    cols = {"die": (L.op_rank, np.int32), "pipe": (L.op_lane, np.uint8), "op": (L.op_parent, np.int32),
            "start_ps": (full.op_start_ps, None), "end_ps": (full.op_end_ps, None), "bytes": (L.op_bytes, None)}
    if L.pipe_task_op.size and full.pipe_tasks is None:
        tasks, n_pipe = pipe_interval_tasks(full, pipe_intervals, lead=inner.size)
        for k, (col, _) in cols.items():  # a column at a time
            tasks[k][:inner.size] = col[inner]
    elif L.pipe_task_op.size or inner.size:  # the pipe intervals given (full.pipe_tasks), or none
        parts = [{k: col[inner] if dtype is None else col[inner].astype(dtype) for k, (col, dtype) in cols.items()}]
        if L.pipe_task_op.size:
            parts.append(full.pipe_tasks)
        tasks = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    del inner, cols
    packets = packet_rows(full, keep) if full.packets is not None else None
    return dict(
        lowered=view, op_start_ps=start, op_end_ps=full.op_end_ps[:nt].copy(), tasks=tasks,
        # The kept messages come first, and only they have packet counts and delivery times.
        msg_packets=full.msg_packets[keep[:full.msg_packets.size]],
        msg_delivered_ps=full.msg_delivered_ps[keep[:full.msg_delivered_ps.size]],
        moe_pairs=moe_pairs(full.trace), packets=packets,
        fabric_messages=L.num_messages, fabric_packets=full.fabric_packets,
        fabric_bytes=L.message_bytes, pipe_intervals=n_pipe,
    )


def check_invariants(result: RunResult) -> None:
    """the invariants of docs/architecture.md that hold after a run: dependencies respected, bytes conserved."""
    from cmemu.lower.passes import early_successor

    L = result.lowered
    start, end = result.op_start_ps, result.op_end_ps
    if np.any(end < start):
        raise SimulationError("internal invariant broken: an op ended before it started")
    i, j = early_successor(L.succ_ptr, L.succ_idx, start, end)
    if i >= 0:
        def label(k):  # an internal op's node id is the engine's alone (drop_engine_inputs)
            return f"node {L.op_node_id[k]}" if k < L.num_trace_ops else _op_label(L, k)

        raise SimulationError(f"internal invariant broken: {label(j)} started before its dependency {label(i)} ended")
    if L.num_messages and np.any(result.msg_delivered_ps < 0):
        raise SimulationError("internal invariant broken: a message was never delivered")
