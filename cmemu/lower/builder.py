"""OpBuilder and Block: how lowering code creates engine ops, edges and messages, and how they
become the engine's arrays.

An ``OpBuilder`` takes ops one or many at a time (columns as scalars or numpy arrays), edges and
messages, into growing columns (``comm.Columns``), so that a collective with hundreds of
thousands of internal ops lowers at numpy speed. What it holds is a ``Block``: ops numbered from
the builder's ``base``, and the edges and messages between them. A block that names, beside its
own ops, only given *member* ops (a collective's: its members' trace ops) can be placed again
at another base for other members: a collective lowered once is copied, not lowered again, for
every later collective of the same shape (the 236 MoE collectives of a 61-layer DeepSeek-R1
decode step are four shapes).

``assemble`` lays blocks one after the other into arrays of their exact total size (no
growing, no second copy) and builds the per-op lists (``cmemu.lower.passes``). Trace nodes come
first (op i is node i of the file); ops a lowering adds for a node's internal work (a
collective's loads, sends, flags) come after, with ``parent`` naming the trace op they belong to
and ``lane`` the pipe or engine that does them (cmemu.vocab.PIPE_NAMES).
"""
from __future__ import annotations

import numpy as np

from cmemu.lower.comm import MSG_COLUMNS, Columns, MessageTable
from cmemu.vocab import MSG_WRITE

_COLUMNS = {
    # name: (dtype, default)
    "kind": (np.uint8, 0),
    "dur": (np.int64, 0),
    "lat": (np.int64, 0),
    "res": (np.int32, -1),
    "msg": (np.int32, -1),
    "aic": (np.int32, 0),
    "aiv": (np.int32, 0),
    "rank": (np.int32, 0),
    "stream": (np.int32, -1),
    "node_id": (np.int64, -1),
    "type": (np.uint8, 0),
    "nbytes": (np.int64, 0),
    "hbm": (np.int64, 0),
    "parent": (np.int32, -1),
    "lane": (np.int8, -1),
    "phase": (np.uint8, 0),  # a collective's step (cmemu.lower.moe.PHASES); 0: none
}
OP_DEFAULTS = {name: default for name, (_, default) in _COLUMNS.items()}


class OpBuilder:
    def __init__(self, base: int = 0):
        self.base = base  # the id of the first op it adds
        self._ops = Columns({name: dtype for name, (dtype, _) in _COLUMNS.items()},
                            {name: default for name, (_, default) in _COLUMNS.items()})
        self._edges = Columns({"src": np.int32, "dst": np.int32})  # op ids are int32, as the engine reads them
        self.messages = MessageTable()
        self.names: list[str] = []  # names of the trace ops (the first ops)
        self.report_start: dict[int, int] = {}  # trace op -> op whose start is its start

    @property
    def n(self) -> int:
        """The id of the next op (ops added so far, after ``base``)."""
        return self.base + self._ops.n

    def ops(self, count: int, **cols) -> np.ndarray:
        """Add ``count`` ops; each column is a scalar or an array of that length. Returns their indices."""
        unknown = set(cols) - set(_COLUMNS)
        if unknown:
            raise KeyError(f"unknown op column(s): {', '.join(sorted(unknown))}")
        first = self.n
        self._ops.append(count, cols)
        return np.arange(first, first + count)

    def op(self, **cols) -> int:
        return int(self.ops(1, **cols)[0])

    def edges(self, src, dst) -> None:
        """Dependencies src[i] -> dst[i] (arrays or scalars, broadcast)."""
        src, dst = np.broadcast_arrays(np.asarray(src, dtype=np.int32), np.asarray(dst, dtype=np.int32))
        if src.size:
            self._edges.append(src.size, {"src": src.ravel(), "dst": dst.ravel()})

    def messages_between(self, topo, src, dst, nbytes, send_op, recv_op, kind: int = MSG_WRITE,
                         plane: str = "ub", ini=None, prep=0, flow=0) -> None:
        """Messages src[i] -> dst[i]; send_op/recv_op are op indices (or -1) that carry them;
        ``ini``, ``prep``, ``flow``: their initiators and ordering (cmemu.lower.comm)."""
        src = np.atleast_1d(np.asarray(src, dtype=np.int64))
        n = src.size
        send_op = np.broadcast_to(np.asarray(send_op, dtype=np.int64), (n,))
        recv_op = np.broadcast_to(np.asarray(recv_op, dtype=np.int64), (n,))
        self.messages.add_many(topo, src, np.broadcast_to(dst, (n,)), np.broadcast_to(nbytes, (n,)),
                               send_op, recv_op, kind=kind, plane=plane, ini=ini,
                               prep=np.broadcast_to(np.asarray(prep, dtype=np.int64), (n,)),
                               flow=np.broadcast_to(np.asarray(flow, dtype=np.int64), (n,)))

    def block(self, members=None) -> "Block":
        """What was added, as a block (the builder is empty afterwards). With ``members``, the
        block may name those ops beside its own, and can be placed at any base (``Block``)."""
        ops = self._ops.take()
        edges = self._edges.take()
        report = np.array(list(self.report_start.items()), dtype=np.int64).reshape(-1, 2)
        block = Block(self.base, self._ops.n, ops, edges["src"], edges["dst"], self.messages.arrays(),
                      report[:, 0], report[:, 1], members)
        self.messages = None
        return block

    def build(self, n_resources: int, die_aic, die_aiv, num_trace_ops: int):
        """The engine's arrays (``Lowered``) of what was added (from op 0); the builder is empty
        afterwards."""
        if self.base:
            raise ValueError("only a builder whose ops start at 0 builds a lowering of its own")
        return assemble([(self.block(), None)], self.names, n_resources, die_aic, die_aiv, num_trace_ops)


class _Ids:
    """Op ids held by a block (in the parent column, edges, messages, report starts) in a form
    that moves: an id of the block's own ops relative to its first op, an id of a member op by
    its number among the members, -1 kept."""

    def __init__(self, ids, base: int, n_ops: int, members):
        ids = np.asarray(ids, dtype=np.int64)
        own = (ids >= base) & (ids < base + n_ops)
        self.rel = np.where(own, ids - base, ids).astype(np.int32)
        self.own = None if own.all() else own  # None: every id is the block's own
        self.ext_at = np.flatnonzero(~own & (ids >= 0))
        names = ids[self.ext_at]
        if names.size:
            order = np.argsort(members)
            known = members[order]
            at = np.minimum(np.searchsorted(known, names), max(known.size - 1, 0))
            found = known[at] == names if known.size else np.zeros(names.size, dtype=bool)
            if not found.all():
                raise RuntimeError(f"a lowered block names op {int(names[~found][0])}, neither its own nor a member's")
            self.ext_member = order[at]

    def write(self, out, base: int, members) -> None:
        """The ids for the block placed at ``base`` with these members, into ``out``."""
        if self.own is None:
            np.add(self.rel, base, out=out)
        else:
            from cmemu.lower.passes import shift_own

            shift_own(self.rel, self.own, base, out)
        if self.ext_at.size:
            out[self.ext_at] = members[self.ext_member]


class Block:
    """Ops numbered from ``base``, with their edges, messages and report starts (``OpBuilder``).

    Without members, its ids are final: it is placed at its own base. With members (an array of
    op ids), it may be placed at any base and for other members of the same number: its own ops
    move with the base, a member's op becomes the other's in the same place, -1 stays.
    """

    def __init__(self, base, n_ops, ops, edge_src, edge_dst, messages, report_op, report_start, members=None):
        self.base, self.n_ops = base, n_ops
        self.ops = ops  # column -> array [n_ops]
        self.messages = messages  # Lowered.msg_* arrays
        self.n_edges, self.n_messages = int(edge_src.shape[0]), int(messages["msg_src"].shape[0])
        self.n_reports = int(report_op.shape[0])
        self.names_messages = bool(np.any(ops["msg"] >= 0))  # ids of its own messages (0 = its first)
        self.members = None if members is None else np.asarray(members, dtype=np.int64)
        self._edge_dst = edge_dst
        if self.members is None:
            self.ids = {"parent": ops["parent"], "src": edge_src, "dst": edge_dst,
                        "msg_send_op": messages["msg_send_op"], "msg_recv_op": messages["msg_recv_op"],
                        "report_op": report_op, "report_start": report_start}
        else:
            self.ids = {"parent": _Ids(ops["parent"], base, n_ops, self.members),
                        "src": _Ids(edge_src, base, n_ops, self.members),
                        "dst": _Ids(edge_dst, base, n_ops, self.members),
                        "msg_send_op": _Ids(messages["msg_send_op"], base, n_ops, self.members),
                        "msg_recv_op": _Ids(messages["msg_recv_op"], base, n_ops, self.members),
                        "report_op": _Ids(report_op, base, n_ops, self.members),
                        "report_start": _Ids(report_start, base, n_ops, self.members)}

    def moves_messages(self) -> bool:
        """Whether its messages placed again are the same but for their ops, which move with the
        base (they name none of the members' ops): then they are the first placement's, their
        op ids shifted (Lowered.msg_segments)."""
        if self.members is None:
            return False
        return all(self.ids[k].ext_at.size == 0 for k in ("msg_send_op", "msg_recv_op"))

    def sorted_edges(self):
        """The edges by source (a stable sort), for laying them straight into the CSR: (the first
        source, relative to ``base``; each source's count from there; the successors in that
        order, to place as ``place`` does). None if a source is a member's op (its successor
        lists are not the block's alone)."""
        if not hasattr(self, "_sorted_edges"):
            src = self.ids["src"]
            if isinstance(src, _Ids):
                rel = None if src.own is not None else src.rel.astype(np.int64)
            else:
                rel = src.astype(np.int64) - self.base
            if rel is None or rel.size == 0:
                self._sorted_edges = None
            else:
                order = np.argsort(rel, kind="stable")
                lo = int(rel[order[0]])
                dst = self._edge_dst[order]
                self._sorted_edges = (lo, np.bincount(rel - lo),
                                      dst if self.members is None else _Ids(dst, self.base, self.n_ops, self.members))
        return self._sorted_edges

    def place(self, key: str, out, base: int, members) -> None:
        ids = self.ids[key]
        if isinstance(ids, _Ids):
            ids.write(out, base, members)
        else:
            if base != self.base:
                raise RuntimeError(f"a block of ops from {self.base} placed at {base}")
            out[:] = ids


def edge_block(base: int, src, dst) -> Block:
    """A block of edges only (between ops placed before it)."""
    empty = np.zeros(0, dtype=np.int32)
    ops = {name: np.zeros(0, dtype=dtype) for name, (dtype, _) in _COLUMNS.items()}
    messages = {name: np.zeros(0, dtype=dtype) for name, dtype in MSG_COLUMNS.items()}
    return Block(base, 0, ops, np.asarray(src, dtype=np.int32), np.asarray(dst, dtype=np.int32), messages, empty,
                 empty)


def _edge_spans(parts):
    """Where each part's edge sources lie, when the edges can go straight into the CSR:
    (first source, block, members, base) of each part with edges, by first source; None if a
    part's sources are not its own ops (``Block.sorted_edges``) or two parts' sources overlap."""
    spans = []
    base = 0
    for block, members in parts:
        if block.n_edges:
            if block.members is None and base != block.base:
                return None  # placed elsewhere: place() says so
            sorted_edges = block.sorted_edges()
            if sorted_edges is None:
                return None
            lo, counts, _ = sorted_edges
            spans.append((base + lo, base + lo + counts.size, block, members, base))
        base += block.n_ops
    spans.sort(key=lambda span: span[0])
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])) or (spans and (spans[0][0] < 0 or spans[-1][1] > base)):
        return None
    return [(lo, block, members, at) for lo, _, block, members, at in spans]


def assemble(parts, names, n_resources: int, die_aic, die_aiv, num_trace_ops: int, fill_copies: bool = True):
    """The engine's arrays (``Lowered``) of blocks laid one after the other: ``parts`` is a list
    of (block, members), members None for a block placed as it is (and emptied: a block is
    dropped once placed for the last time). The arrays are allocated at their final size and
    filled block by block; with ``fill_copies`` False, the messages of a block placed again are
    not written (``Lowered.msg_filled``)."""
    from cmemu.lower import Lowered
    from cmemu.lower.passes import name_messages, predecessor_counts, successor_csr

    n = sum(b.n_ops for b, _ in parts)
    m = sum(b.n_messages for b, _ in parts)
    e = sum(b.n_edges for b, _ in parts)
    spans = _edge_spans(parts)
    cols = {name: np.empty(n, dtype=dtype) for name, (dtype, _) in _COLUMNS.items()}
    msgs = {name: np.empty(m, dtype=dtype) for name, dtype in MSG_COLUMNS.items()}
    if spans is None:  # the edges in the order given, sorted by source at the end
        src, dst = np.empty(e, dtype=np.int32), np.empty(e, dtype=np.int32)
    report = np.full(n, -1, dtype=np.int32)
    segments = []  # (first message, messages, first message of its template, op shift): Lowered.msg_segments
    op_lo = msg_lo = edge_lo = 0
    parts.reverse()
    while parts:
        block, members = parts.pop()
        op_hi, msg_hi, edge_hi = op_lo + block.n_ops, msg_lo + block.n_messages, edge_lo + block.n_edges
        copy = False
        if block.n_messages:
            first = getattr(block, "first_placed", None)
            copy = first is not None and block.moves_messages()
            if copy:
                segments.append((msg_lo, block.n_messages, first[0], op_lo - first[1]))
            else:
                segments.append((msg_lo, block.n_messages, msg_lo, 0))
                block.first_placed = (msg_lo, op_lo)
        for name, col in cols.items():
            if name == "parent":
                block.place("parent", col[op_lo:op_hi], op_lo, members)
            elif name == "msg" and block.names_messages:  # ids of its own messages
                np.add(block.ops["msg"], msg_lo, out=col[op_lo:op_hi], where=block.ops["msg"] >= 0)
                col[op_lo:op_hi][block.ops["msg"] < 0] = -1
            else:
                col[op_lo:op_hi] = block.ops[name]
        if fill_copies or not copy:  # (a copy's messages are its template's, its ops shifted: msg_segments)
            for name, col in msgs.items():
                if name in ("msg_send_op", "msg_recv_op"):
                    block.place(name, col[msg_lo:msg_hi], op_lo, members)
                else:
                    col[msg_lo:msg_hi] = block.messages[name]
        if spans is None:
            block.place("src", src[edge_lo:edge_hi], op_lo, members)
            block.place("dst", dst[edge_lo:edge_hi], op_lo, members)
        if block.n_reports:
            where, start = np.empty(block.n_reports, dtype=np.int64), np.empty(block.n_reports, dtype=np.int64)
            block.place("report_op", where, op_lo, members)
            block.place("report_start", start, op_lo, members)
            report[where] = start
        op_lo, msg_lo, edge_lo = op_hi, msg_hi, edge_hi
        del block
    msg = cols.pop("msg")
    segments = np.array(segments, dtype=np.int64).reshape(-1, 4)
    filled = fill_copies or bool(np.all(segments[:, 2] == segments[:, 0]))
    # An op that carries messages and was not given one names one of them (cmemu.lower.passes).
    name_messages(msg, msgs["msg_send_op"], msgs["msg_recv_op"], None if filled else segments)
    if spans is None:
        succ_ptr, succ_idx, npred = successor_csr(src, dst, n)
        del src, dst
    else:
        # Each block's successor lists, in the order of their sources' spans: the CSR itself.
        succ_ptr = np.zeros(n + 1, dtype=np.int64)
        succ_idx = np.empty(e, dtype=np.int32)
        at = 0
        for lo, block, members, base in spans:
            _, counts, dst = block.sorted_edges()
            succ_ptr[lo + 1:lo + 1 + counts.size] = counts
            if isinstance(dst, _Ids):
                dst.write(succ_idx[at:at + block.n_edges], base, members)
            else:
                succ_idx[at:at + block.n_edges] = dst
            at += block.n_edges
        del spans
        np.cumsum(succ_ptr, out=succ_ptr)
        npred = predecessor_counts(succ_idx, n)
    return Lowered(
        op_kind=cols["kind"],
        op_dur_ps=cols["dur"],
        op_lat_ps=cols["lat"],
        op_res=cols["res"],
        op_msg=msg,
        op_npred=npred,
        op_aic=cols["aic"],
        op_aiv=cols["aiv"],
        die_aic_cores=np.asarray(die_aic, dtype=np.int32),
        die_aiv_cores=np.asarray(die_aiv, dtype=np.int32),
        succ_ptr=succ_ptr,
        succ_idx=succ_idx,
        **msgs,
        n_resources=n_resources,
        op_node_id=cols["node_id"],
        op_type=cols["type"],
        op_rank=cols["rank"],
        op_stream=cols["stream"],
        op_bytes=cols["nbytes"],
        op_hbm_bytes=cols["hbm"],
        op_name=names,
        op_parent=cols["parent"],
        op_lane=cols["lane"],
        op_report_start=report,
        op_phase=cols["phase"],
        num_trace_ops=num_trace_ops,
        msg_segments=segments,
        msg_filled=filled,
    )
