"""Lowering: a validated trace plus a topology -> the flat typed arrays the core engine reads.

Each op becomes one engine op with a kind, a duration or a message; dependencies (data, control
and stream order) become a CSR successor list and a count of predecessors. Python objects never
reach the engine. The mechanisms live in ``compute`` (COMP), ``memory`` (MEM_*), ``comm`` (COMM_*).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from cmemu.lower.builder import OpBuilder
from cmemu.lower.comm import MSG_COLUMNS, MessageTable
from cmemu.lower.compute import comp_cost, comp_duration_ps
from cmemu.lower.memory import hbm_latency_ps, hbm_service_ps
from cmemu.topology import Topology
from cmemu.vocab import NODE_TYPE_CODE, NODE_TYPES, OP_KIND_COMP, OP_KIND_MEM, OP_KIND_RECV, OP_KIND_SEND

# How the engine runs each trace node type.
_KIND_OF_TYPE = {
    "COMP": OP_KIND_COMP,
    "COMM_SEND": OP_KIND_SEND,
    "COMM_RECV": OP_KIND_RECV,
    "MEM_LOAD": OP_KIND_MEM,
    "MEM_STORE": OP_KIND_MEM,
    "COMM_COLL": OP_KIND_COMP,  # the collective's exit: it ends when its internal ops have
}


@dataclass
class Lowered:
    """Everything the engine needs, as numpy arrays, plus per-op metadata for the timeline."""

    # Engine inputs.
    op_kind: np.ndarray  # uint8 [ops]
    op_dur_ps: np.ndarray  # int64 [ops]: COMP duration, MEM service time
    op_lat_ps: np.ndarray  # int64 [ops]: MEM access latency
    op_res: np.ndarray  # int32 [ops]: MEM server (die), else -1
    op_msg: np.ndarray  # int32 [ops]: message of a SEND/RECV, else -1
    op_npred: np.ndarray  # int32 [ops]
    op_aic: np.ndarray  # int32 [ops]: AIC cores the op holds while it runs
    op_aiv: np.ndarray  # int32 [ops]: AIV cores the op holds while it runs
    die_aic_cores: np.ndarray  # int32 [dies]: AIC cores of each die
    die_aiv_cores: np.ndarray  # int32 [dies]
    succ_ptr: np.ndarray  # int64 [ops + 1]
    succ_idx: np.ndarray  # int32 [edges]
    msg_src: np.ndarray  # uint16 [msgs]: endpoint the data leaves
    msg_dst: np.ndarray  # uint16 [msgs]: endpoint the data reaches
    msg_bytes: np.ndarray  # int64 [msgs]
    msg_kind: np.ndarray  # uint8 [msgs]: cmemu.vocab.MSG_WRITE / MSG_READ
    msg_path: np.ndarray  # uint8 [msgs]: cmemu.vocab.PATH_UB / PATH_D2D / PATH_RDMA
    msg_send_op: np.ndarray  # int32 [msgs]: -1 if none
    msg_recv_op: np.ndarray  # int32 [msgs]: -1 if none
    msg_ini: np.ndarray  # uint16 [msgs]: its initiator (cmemu.lower.comm: an endpoint, or an AIV's id)
    msg_prep: np.ndarray  # int32 [msgs]: ps of its AIV's own work before it (cmemu.lower.comm)
    msg_flow: np.ndarray  # uint8 [msgs]: how it waits for its AIV's earlier messages (cmemu.lower.comm)
    n_resources: int
    # Metadata for the timeline (not read by the engine).
    op_node_id: np.ndarray  # int64 [ops]
    op_type: np.ndarray  # uint8 [ops]: index into NODE_TYPES
    op_rank: np.ndarray  # int32 [ops]
    op_stream: np.ndarray  # int32 [ops]
    op_bytes: np.ndarray  # int64 [ops]
    op_hbm_bytes: np.ndarray  # int64 [ops]: HBM bytes the op reads and writes on its own die
    op_name: list  # names of the trace ops (the first num_trace_ops ops)
    op_parent: np.ndarray  # int32 [ops]: the trace op an internal op belongs to, else -1
    op_lane: np.ndarray  # int8 [ops]: pipe/engine of an internal op (cmemu.vocab.PIPE_NAMES), else -1
    op_report_start: np.ndarray  # int32 [ops]: op whose start is this trace op's start, else -1
    op_phase: np.ndarray  # uint8 [ops]: the step of a collective an internal op is (cmemu.lower.moe.PHASES), else 0
    num_trace_ops: int
    # The die model's pipe occupancy of each COMP op: one row per (op, pipe) the op used, with the
    # pipe's busy time per core (cmemu.vocab.PIPE_CODE); recorded as /tasks summaries.
    pipe_task_op: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    pipe_task_pipe: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint8))
    pipe_task_busy_ps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # HBM bandwidth a die's running COMP ops share (bytes/s; empty or 0: each op runs as timed
    # alone). See cmemu._core.hbm_sharing.
    die_hbm_byte_per_s: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # What one AIC / one AIV of a die moves at most between HBM and its buffers (bytes/s;
    # core_move_byte_per_s): an op's HBM demand is at most its cores' (empty or 0: no such cap).
    die_aic_move_byte_per_s: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    die_aiv_move_byte_per_s: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Messages repeated by collectives placed again: int64 [segments, 4] rows (first message, count,
    # first message of its template, op shift) in message order, covering them all: messages
    # lo..lo+count-1 are the template's, their send/recv ops (>= 0) plus the shift. A segment whose
    # template is itself holds the messages first seen there. None: no such description. The
    # engine keeps one copy of each template (Engine: the messages' table).
    msg_segments: np.ndarray | None = None
    # Set when the msg_* columns were cut to the trace's own messages (drop_engine_messages):
    # (messages, their bytes) of the whole run; -1: the columns are whole.
    msg_total: tuple = (-1, -1)
    # False: the rows of the messages that repeat a template (msg_segments) are not written; their
    # columns (COPIED_MSG_COLUMNS, SHIFTED_MSG_COLUMNS) are filled by fill_messages(), which
    # whatever reads them calls first, and the passes over every message read their ops through
    # the segments (message_segments). lower(fill_messages=False) leaves them so for an engine
    # that reads only the templates and then drops the columns (run_trace), without writing
    # them (1.3 GB of the 61-layer decode step).
    msg_filled: bool = True

    @property
    def num_ops(self) -> int:
        return int(self.op_kind.shape[0])

    # The msg_* columns a template's copies take from it as they are, and those they take shifted
    # (the template's ops plus the segment's op shift; -1 stays).
    COPIED_MSG_COLUMNS = ("msg_src", "msg_dst", "msg_bytes", "msg_kind", "msg_path", "msg_ini", "msg_prep", "msg_flow")
    SHIFTED_MSG_COLUMNS = ("msg_send_op", "msg_recv_op")

    def message_segments(self):
        """The segments the passes over every message read its send and receive ops through: the
        msg_segments while the copies are not written (msg_filled False), else None (the columns
        as they are; cmemu.lower.passes.message_segments)."""
        return None if self.msg_filled else self.msg_segments

    def fill_messages(self, upto: int | None = None) -> None:
        """Fill the copied columns of the messages that repeat a template (see msg_filled): all
        of them, or those of the first ``upto`` messages."""
        if self.msg_filled:
            return
        segs = self.msg_segments
        end = self.msg_send_op.shape[0] if upto is None else min(int(upto), self.msg_send_op.shape[0])
        for lo, count, tpl, shift in segs[(segs[:, 2] != segs[:, 0]) & (segs[:, 0] < end)].tolist():
            k = min(count, end - lo)
            for name in self.COPIED_MSG_COLUMNS:
                column = getattr(self, name)
                column[lo:lo + k] = column[tpl:tpl + k]
            for name in self.SHIFTED_MSG_COLUMNS:
                column = getattr(self, name)
                ops = column[tpl:tpl + k]
                column[lo:lo + k] = np.where(ops >= 0, ops + shift, ops)
        if upto is None or end == self.msg_send_op.shape[0]:
            self.msg_filled = True

    def trace_view(self) -> tuple["Lowered", np.ndarray]:
        """The same, cut down to the trace's own ops and the messages between them (what the
        timeline's /ops and /messages hold); also returns the mask of kept messages (of the
        msg_* columns: after drop_engine_messages, of the trace's own messages)."""
        nt = self.num_trace_ops
        self.fill_messages()
        if nt == self.num_ops:
            return self, np.ones(self.msg_send_op.shape[0], dtype=bool)
        # 0 <= op < nt, both ends, as one unsigned comparison each (-1 is above any op count).
        keep = self.msg_send_op.view(np.uint32) < nt
        keep &= self.msg_recv_op.view(np.uint32) < nt
        cut = {f.name: getattr(self, f.name)[:nt] for f in dataclasses.fields(self)
               if f.name.startswith("op_") and f.name != "op_name"}
        cut.update({name: getattr(self, name)[keep] for name in MSG_COLUMNS})
        cut["msg_segments"], cut["msg_total"] = None, (-1, -1)
        # The trace ops come first, so their successor lists are the CSR's first succ_ptr[nt].
        head = self.succ_idx[:int(self.succ_ptr[nt])]
        src = np.repeat(np.arange(nt), np.diff(self.succ_ptr[:nt + 1]))
        keep_edge = head < nt
        succ_ptr = np.zeros(nt + 1, dtype=np.int64)
        np.cumsum(np.bincount(src[keep_edge], minlength=nt), out=succ_ptr[1:])
        cut["op_npred"] = np.bincount(head[keep_edge], minlength=nt).astype(np.int32)
        if keep.size:
            kept = np.flatnonzero(keep)  # the new id of a kept message is its place among them
            # An op's message may lie past the kept columns (a load from a CPU's memory: a read with
            # no send op, which /messages does not list).
            named = (self.op_msg[:nt] >= 0) & (self.op_msg[:nt] < keep.size)
            om = np.where(named, self.op_msg[:nt], 0)
            cut["op_msg"] = np.where(named & keep[om], np.searchsorted(kept, om), -1).astype(np.int32)
        view = dataclasses.replace(self, succ_ptr=succ_ptr, succ_idx=head[keep_edge], **cut)
        return view, keep

    # What only the engine reads of an internal op (its copy, made when it starts), and what only
    # the trace's ops need afterwards (trace_view, the timeline, error messages); an internal op
    # has no report start either. (Its duration went into the HBM sharing, which the engine gives
    # back: Engine.hbm_shared_ops.)
    ENGINE_ONLY = ("op_res", "op_msg", "op_npred", "op_aic", "op_aiv", "op_node_id", "op_type", "op_stream",
                   "op_report_start", "op_dur_ps")

    def drop_engine_inputs(self) -> None:
        """Cut the ENGINE_ONLY columns to the trace's ops once an engine has been built from
        this lowering: run_trace does so, for the gigabytes the collectives' internal ops hold
        in them on a big run. What the run's results are built from afterwards (kinds, latencies,
        dies, lanes, parents, bytes, dependencies, messages) stays whole."""
        nt = self.num_trace_ops
        for name in self.ENGINE_ONLY:
            column = getattr(self, name)
            if column.shape[0] > nt:
                setattr(self, name, column[:nt].copy())

    def leading_trace_messages(self) -> int:
        """How many of the first messages are all the trace's own (those trace_view keeps): the
        lowering puts them before any message a collective makes. The number of messages if
        they are not all first (then every message has to be kept track of)."""
        from cmemu.lower.passes import leading_kept

        cached = self.__dict__.get("_leading")
        if cached is not None and cached[0] is self.msg_send_op:
            return cached[1]
        n = leading_kept(self.msg_send_op, self.msg_recv_op, self.num_trace_ops, self.message_segments())
        n = self.msg_send_op.shape[0] if n < 0 else n
        self.__dict__["_leading"] = (self.msg_send_op, n)  # asked for twice on a run (run_trace)
        return n

    def name_of(self, i: int) -> str:
        """A trace op's name, or for an internal op its parent's name and its index."""
        if i < self.num_trace_ops:
            return self.op_name[i]
        parent = int(self.op_parent[i])
        return f"{self.op_name[parent]}/op{i}" if parent >= 0 else f"op{i}"

    @property
    def num_messages(self) -> int:
        return int(self.msg_send_op.shape[0]) if self.msg_total[0] < 0 else self.msg_total[0]

    @property
    def message_bytes(self) -> int:
        """Bytes of all the messages."""
        return self.msg_total[1] if self.msg_total[0] >= 0 else int(self.bytes_sum(np.int64))

    def bytes_sum(self, dtype):
        """The messages' bytes summed in ``dtype`` (float64: no overflow, as check_clock_range
        needs), with the columns whole; of unfilled copies (msg_filled), their templates'."""
        if self.msg_filled:
            return self.msg_bytes.sum(dtype=dtype)
        # A copy's bytes are its template's: each template summed once, counted per copy.
        segs = self.msg_segments
        own = segs[segs[:, 2] == segs[:, 0]]
        of = {lo: self.msg_bytes[lo:lo + count].sum(dtype=dtype) for lo, count in own[:, :2].tolist()}
        return np.sum([of[tpl] for tpl in segs[:, 2].tolist()], dtype=dtype)

    def prep_max(self) -> int:
        """The largest msg_prep (0 without messages); of unfilled copies (msg_filled), their
        templates' (the copies' rows hold nothing yet)."""
        if not self.msg_prep.size:
            return 0
        if self.msg_filled:
            return int(self.msg_prep.max())
        own = self.msg_segments[self.msg_segments[:, 2] == self.msg_segments[:, 0]]
        return max((int(self.msg_prep[lo:lo + count].max()) for lo, count in own[:, :2].tolist() if count), default=0)

    def drop_engine_messages(self) -> None:
        """Cut the msg_* columns to the trace's own messages (leading_trace_messages) once an
        engine holds its own copy of them (Engine.owns_messages): the collectives' internal
        messages, 57 M on the 61-layer decode step, are the engine's from then on."""
        if self.msg_total[0] >= 0:
            return
        keep = self.leading_trace_messages()
        total = (self.num_messages, self.message_bytes)
        self.fill_messages(keep)
        for name in MSG_COLUMNS:
            setattr(self, name, getattr(self, name)[:keep].copy())
        self.msg_total = total
        self.msg_segments = None
        self.msg_filled = True
        self.__dict__["_leading"] = (self.msg_send_op, keep)  # not the whole column's, which would stay



def _op_bytes(node) -> int:
    a = node.attrs
    if node.type in ("COMM_SEND", "COMM_RECV"):
        return int(a["comm_size"])
    if node.type == "COMM_COLL":
        return int(a.get("comm_size", 0))
    return int(a.get("tensor_size", 0))


def _node_columns(trace, die) -> tuple[dict, tuple, list]:
    """Per trace node: the engine columns that follow from its type and attributes.

    Nodes of one type with one attrs dict (the loader shares a dict between nodes whose
    attributes are equal) are one *shape*: its cost is computed once, at its first node in file
    order (so the first bad node is the one an error names), and spread to every node by
    indexing. Returns the columns, the pipe-task rows and the node names.
    """
    from cmemu.die.ops import held_cores

    nodes = trace.nodes
    n = len(nodes)
    # (type, attrs dict) as one number: the dict's id (an address, below 2**48) and the type's code.
    key = np.fromiter(map(id, map(attrgetter("attrs"), nodes)), dtype=np.int64, count=n) * len(NODE_TYPES)
    key += np.fromiter(map(NODE_TYPE_CODE.__getitem__, map(attrgetter("type"), nodes)), dtype=np.int64, count=n)
    _, first, shape = np.unique(key, return_index=True, return_inverse=True)
    del key
    renumber = np.empty(first.size, dtype=np.int64)  # shapes numbered in order of their first node
    renumber[np.argsort(first)] = np.arange(first.size)
    shape = renumber[shape.reshape(-1)]
    first = np.sort(first)
    mem_latency = (hbm_latency_ps(die, store=False), hbm_latency_ps(die, store=True))
    table = {c: np.zeros(first.size, dtype=dt) for c, dt in
             (("kind", np.uint8), ("type", np.uint8), ("nbytes", np.int64), ("dur", np.int64), ("lat", np.int64),
              ("aic", np.int32), ("aiv", np.int32), ("hbm", np.int64))}
    pipes = []  # per shape: (pipe codes, busy ps per core) of the die model's pipe tasks
    for s, i in enumerate(first.tolist()):
        node = nodes[i]
        table["kind"][s] = kind = _KIND_OF_TYPE[node.type]
        table["type"][s] = NODE_TYPE_CODE[node.type]
        table["nbytes"][s] = nbytes = _op_bytes(node)
        rows = ()
        if node.type == "COMP":
            table["dur"][s] = comp_duration_ps(node, die, trace.path)
            table["aic"][s], table["aiv"][s] = held_cores(die, node.attrs)
            cost = comp_cost(node, die, trace.path)
            if cost is not None:
                table["hbm"][s] = cost.hbm_byte
                rows = _pipe_tasks(cost, die)
        elif node.type == "MEM_LOAD" and "cmemu.src_cpu" in node.attrs and nbytes:
            # From a CPU's memory: a read message the die's DMA engines issue (_trace_messages),
            # carried by the op as a receive; it writes into HBM at the fabric's rate.
            table["kind"][s] = OP_KIND_RECV
        elif kind == OP_KIND_MEM:
            table["hbm"][s] = nbytes
            table["dur"][s] = hbm_service_ps(nbytes, die, store=node.type == "MEM_STORE")
            table["lat"][s] = mem_latency[node.type == "MEM_STORE"]
        pipes.append(rows)
    cols = {c: col[shape] for c, col in table.items()}
    graph = trace.graph
    cols["rank"], cols["stream"], cols["node_id"] = graph.rank, graph.stream, graph.id
    cols["res"] = np.where(cols["kind"] == OP_KIND_MEM, cols["rank"], -1).astype(np.int32)  # one HBM server per die
    # Pipe-task rows in op order: each op repeats its shape's rows.
    count = np.array([len(r) for r in pipes], dtype=np.int64)[shape]
    ops = np.repeat(np.arange(n), count)
    flat = np.array([row for r in pipes for row in r], dtype=np.int64).reshape(-1, 2)
    start = np.concatenate([[0], np.cumsum([len(r) for r in pipes], dtype=np.int64)])[:-1].astype(np.int64)
    local = np.arange(ops.size) - np.repeat(np.cumsum(count) - count, count)
    src = np.repeat(start[shape], count) + local
    rows = (ops, flat[src, 0], flat[src, 1])
    return cols, rows, list(map(attrgetter("name"), nodes))


def lower(trace, topo: Topology, fill_messages: bool = True) -> Lowered:
    """Lower a validated trace (``cmemu.trace.Trace``) onto a topology. ``fill_messages``
    False: the copies of a template's messages are left unfilled (``Lowered.msg_filled``)."""
    from cmemu.lower.builder import OP_DEFAULTS, Block, assemble, edge_block
    from cmemu.lower.collectives import collective_blocks

    die = topo.spec.die
    n = len(trace.nodes)
    cols, (pipe_op, pipe_code, pipe_busy), names = _node_columns(trace, die)
    messages = _trace_messages(trace, topo, cols["rank"])
    empty = np.zeros(0, dtype=np.int32)
    head = Block(0, n, {**OP_DEFAULTS, **cols}, empty, empty, messages, empty, empty)
    del cols, messages

    # A collective's node is its exit; its dependencies lead to an entry op instead.
    parts, members, entries = collective_blocks(topo, trace, n)
    to = np.arange(n)
    to[members] = entries

    # Edges pred -> succ: data deps, control deps and stream order.
    src, dst = _trace_edges(trace.graph)
    ops = n + sum(block.n_ops for block, _ in parts)
    parts = [(head, None), *parts, (edge_block(ops, src, to[dst]), None)]
    del head, src, dst, to
    dies = topo.num_dies
    lowered = assemble(parts, names, dies, np.full(dies, die.aic_cores), np.full(dies, die.aiv_cores),
                       num_trace_ops=n, fill_copies=fill_messages)
    lowered.die_hbm_byte_per_s = np.full(dies, hbm_capacity_byte_per_s(die), dtype=np.int64)
    aic_move, aiv_move = core_move_byte_per_s(die)
    lowered.die_aic_move_byte_per_s = np.full(dies, aic_move, dtype=np.int64)
    lowered.die_aiv_move_byte_per_s = np.full(dies, aiv_move, dtype=np.int64)
    if pipe_op.size:
        lowered.pipe_task_op = pipe_op.astype(np.int32)
        lowered.pipe_task_pipe = pipe_code.astype(np.uint8)
        lowered.pipe_task_busy_ps = pipe_busy
    return lowered


def _trace_messages(trace, topo, rank) -> dict:
    """The trace's own messages (matched COMM_SEND/COMM_RECV pairs, in the sends' file order) as
    Lowered.msg_* arrays: each carried by its send and its receive op; then one read message per
    MEM_LOAD from a CPU's memory (``cmemu.src_cpu``), from the CPU to the op's die, carried by the
    op alone (no send op: the die's DMA engines read it)."""
    from cmemu.errors import TraceError
    from cmemu.vocab import MSG_READ, PLANES

    nodes = trace.nodes
    send, recv = trace.graph.messages[:, 0], trace.graph.messages[:, 1]
    attrs = [nodes[i].attrs for i in send.tolist()]
    table = MessageTable()
    table.add_many(topo, rank[send], rank[recv], np.array([a["comm_size"] for a in attrs], dtype=np.int64), send,
                   recv, plane=np.array([PLANES.index(a.get("cmemu.plane", "ub")) for a in attrs], dtype=np.int64))
    loads = [i for i, node in enumerate(nodes) if node.type == "MEM_LOAD" and "cmemu.src_cpu" in node.attrs
             and node.attrs["tensor_size"]]
    if loads:
        for i in loads:
            if nodes[i].attrs["cmemu.src_cpu"] >= topo.num_cpus:
                raise TraceError(trace.path, f"CPU {nodes[i].attrs['cmemu.src_cpu']} is outside the system: "
                                 f"{topo.spec.name} has CPUs 0..{topo.num_cpus - 1}", nodes[i].id, "cmemu.src_cpu")
        la = [nodes[i].attrs for i in loads]
        loads = np.asarray(loads, dtype=np.int64)
        table.add_many(topo, topo.spec.dies + np.array([a["cmemu.src_cpu"] for a in la], dtype=np.int64), rank[loads],
                       np.array([a["tensor_size"] for a in la], dtype=np.int64), np.full(loads.size, -1), loads,
                       kind=MSG_READ, plane=np.array([PLANES.index(a.get("cmemu.plane", "ub")) for a in la]))
    return table.arrays()


def _trace_edges(graph) -> tuple[np.ndarray, np.ndarray]:
    """(pred, succ) node indices of the trace's edges: for each node in file order its data
    deps, its control deps, then the node before it on its (rank, stream)."""
    after = np.flatnonzero(graph.stream_pred >= 0).astype(np.int32)
    pred = np.concatenate([graph.data_pred, graph.ctrl_pred, graph.stream_pred[after]])
    succ = np.concatenate([graph.data_succ, graph.ctrl_succ, after])
    by_succ = np.argsort(succ, kind="stable")  # each node's edges together, in the order above
    return pred[by_succ], succ[by_succ]


def hbm_capacity_byte_per_s(die) -> int:
    """What a die's HBM delivers to all its running ops together: the die model's achieved
    sequential streaming read bandwidth (cmemu/die/hbm.py: bursts, row misses, refresh)."""
    from cmemu.die.model import DieModel

    m = DieModel.of(die)
    return int(m.hbm_read_byte_per_cycle / m.cycle_ps * 1e12)


def core_move_byte_per_s(die) -> tuple[int, int]:
    """What one AIC and one AIV can move between HBM and their buffers at most (bytes/s), from
    the die spec's per-core rates at the AI-core clock: an AIC reads through its MTE2
    (``mte2_byte_per_cycle``) and writes through its FixPipe (``fixpipe_byte_per_cycle``: its
    results leave L0C for GM that way, not through an MTE3); an AIV reads through its MTE2
    (``aiv_mte2_byte_per_cycle``) and writes through its MTE3 (``mte3_byte_per_cycle``). Reads
    and writes can overlap, so the two add up."""
    from cmemu.die.model import DieModel

    m = DieModel.of(die)
    hz = die.ai_core_clock_mhz * 1e6
    aic = (m.mte2_milli_byte_per_cycle(aiv=False) / 1000 + die.fixpipe_byte_per_cycle) * hz
    aiv = (m.mte2_milli_byte_per_cycle(aiv=True) / 1000 + die.mte3_byte_per_cycle) * hz
    return int(aic), int(aiv)


def _pipe_tasks(cost, die) -> list:
    """(pipe, busy ps per core) for each pipe the die model kept busy in an op of this cost."""
    from cmemu.vocab import PIPE_CODE

    cycle_ps = 1e6 / die.ai_core_clock_mhz
    rows = []
    for key, cycles in cost.pipe_busy_cycles.items():
        unit, pipe = key.split(".")
        cores = cost.aic_cores if unit == "AIC" else cost.aiv_cores
        if cycles > 0 and cores > 0 and pipe in PIPE_CODE:
            rows.append((PIPE_CODE[pipe], round(cycles / cores * cycle_ps)))
    return rows


def lowered_from_parts(kind, dur, succ_src, succ_dst, messages: MessageTable | None, op_msg=None, rank=None) -> Lowered:
    """Engine input built directly, without a trace: for scenarios, benchmarks and tests.

    ``kind`` and ``dur`` per op (OP_KIND_*, picoseconds), dependency edges ``succ_src`` ->
    ``succ_dst`` (op indices), and the messages the SEND/RECV ops carry (``op_msg``). The ops
    hold no cores.
    """
    n = len(kind)
    kind = np.asarray(kind, dtype=np.uint8)
    type_of_kind = np.zeros(4, dtype=np.uint8)
    type_of_kind[[OP_KIND_COMP, OP_KIND_SEND, OP_KIND_RECV]] = [
        NODE_TYPE_CODE["COMP"], NODE_TYPE_CODE["COMM_SEND"], NODE_TYPE_CODE["COMM_RECV"]]
    rank = np.asarray(rank if rank is not None else np.zeros(n), dtype=np.int32)
    b = OpBuilder()
    b.names = [f"op{i}" for i in range(n)]
    b.ops(n, kind=kind, dur=np.asarray(dur, dtype=np.int64), rank=rank, stream=0,
          node_id=np.arange(n), type=type_of_kind[kind],
          msg=np.asarray(op_msg if op_msg is not None else np.full(n, -1), dtype=np.int32))
    if messages is not None:
        b.messages = messages
    b.edges(succ_src, succ_dst)
    dies = int(rank.max()) + 1 if n else 1
    return b.build(1, np.zeros(dies), np.zeros(dies), num_trace_ops=n)
