"""OpBuilder: the one way lowering code creates engine ops, edges and messages.

Ops are added one or many at a time (columns as scalars or numpy arrays) straight into growing
columns (``comm.Columns``), so that collectives with hundreds of thousands of internal ops lower
at numpy speed and ``build()`` hands the columns over without copying them. Trace nodes come first (op i is node i of the file); ops a lowering adds for a node's
internal work (a collective's loads, sends, flags) come after, with ``parent`` naming the trace
op they belong to and ``lane`` the pipe or engine that does them (cmemu.output.schema.PIPE_NAMES).
"""
from __future__ import annotations

import numpy as np

from cmemu.lower.comm import Columns, MessageTable
from cmemu.lower.fabric import MSG_WRITE

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
}


class OpBuilder:
    def __init__(self):
        self._ops = Columns({name: dtype for name, (dtype, _) in _COLUMNS.items()},
                            {name: default for name, (_, default) in _COLUMNS.items()})
        self._edges = Columns({"src": np.int32, "dst": np.int32})  # op ids are int32, as the engine reads them
        self.messages = MessageTable()
        self.names: list[str] = []  # names of the trace ops (the first ops)
        self.report_start: dict[int, int] = {}  # trace op -> op whose start is its start

    @property
    def n(self) -> int:
        """Ops added so far."""
        return self._ops.n

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
                         plane: str = "ub") -> None:
        """Messages src[i] -> dst[i]; send_op/recv_op are op indices (or -1) that carry them."""
        src = np.atleast_1d(np.asarray(src, dtype=np.int64))
        n = src.size
        send_op = np.broadcast_to(np.asarray(send_op, dtype=np.int64), (n,))
        recv_op = np.broadcast_to(np.asarray(recv_op, dtype=np.int64), (n,))
        self.messages.add_many(topo, src, np.broadcast_to(dst, (n,)), np.broadcast_to(nbytes, (n,)),
                               send_op, recv_op, kind=kind, plane=plane)

    def build(self, n_resources: int, die_aic, die_aiv, num_trace_ops: int):
        """The engine's arrays (``Lowered``). The builder is empty afterwards: its columns become
        the result's arrays, without a copy."""
        from cmemu.lower import Lowered

        n = self.n
        messages = self.messages.arrays()
        self.messages = None
        cols = self._ops.take()
        msg = cols.pop("msg")
        # An op that carries messages and was not given one names one of them (the last), a
        # block of messages at a time (no temporaries the size of the whole table).
        block = 1 << 22
        for key in ("msg_send_op", "msg_recv_op"):
            ops = messages[key]
            free = msg < 0  # before this pass
            for lo in range(0, ops.size, block):
                part = ops[lo:lo + block]
                if part.max() < 0:
                    continue  # no op carries these (a collective's writes have no receive op)
                has = (part >= 0) & (part < n)
                has[has] = free[part[has]]
                at = np.flatnonzero(has)
                msg[part[at]] = (lo + at).astype(np.int32)
            del free
        edges = self._edges.take()
        src, dst = edges.pop("src"), edges.pop("dst")
        succ_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
        if src.size:
            # Grouped by source for the CSR lists. A repeated edge is harmless: it is counted in
            # the successor's predecessors and released as often.
            order = np.argsort(src, kind="stable")
            del src
            dst = dst[order]
            del order
        report = np.full(n, -1, dtype=np.int32)
        for op, start_from in self.report_start.items():
            report[op] = start_from
        return Lowered(
            op_kind=cols["kind"],
            op_dur_ps=cols["dur"],
            op_lat_ps=cols["lat"],
            op_res=cols["res"],
            op_msg=msg,
            op_npred=np.bincount(dst, minlength=n).astype(np.int32),
            op_aic=cols["aic"],
            op_aiv=cols["aiv"],
            die_aic_cores=np.asarray(die_aic, dtype=np.int32),
            die_aiv_cores=np.asarray(die_aiv, dtype=np.int32),
            succ_ptr=succ_ptr,
            succ_idx=dst,
            **messages,
            n_resources=n_resources,
            op_node_id=cols["node_id"],
            op_type=cols["type"],
            op_rank=cols["rank"],
            op_stream=cols["stream"],
            op_bytes=cols["nbytes"],
            op_hbm_bytes=cols["hbm"],
            op_name=self.names,
            op_parent=cols["parent"],
            op_lane=cols["lane"],
            op_report_start=report,
            num_trace_ops=num_trace_ops,
        )
