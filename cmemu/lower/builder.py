"""OpBuilder: the one way lowering code creates engine ops, edges and messages.

Columns are collected in chunks (a single op, or many at once as numpy arrays) and joined once
at ``build()``, so that collectives with hundreds of thousands of internal ops lower at numpy
speed. Trace nodes come first (op i is node i of the file); ops a lowering adds for a node's
internal work (a collective's loads, sends, flags) come after, with ``parent`` naming the trace
op they belong to and ``lane`` the pipe or engine that does them (cmemu.output.schema.PIPE_NAMES).
"""
from __future__ import annotations

import numpy as np

from cmemu.lower.comm import MessageTable
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
        self.n = 0
        self._chunks = []  # (count, {column: scalar or array})
        self._esrc = []
        self._edst = []
        self.messages = MessageTable()
        self.names: list[str] = []  # names of the trace ops (the first ops)
        self.report_start: dict[int, int] = {}  # trace op -> op whose start is its start

    def ops(self, count: int, **cols) -> np.ndarray:
        """Add ``count`` ops; each column is a scalar or an array of that length. Returns their indices."""
        unknown = set(cols) - set(_COLUMNS)
        if unknown:
            raise KeyError(f"unknown op column(s): {', '.join(sorted(unknown))}")
        first = self.n
        self._chunks.append((count, cols))
        self.n += count
        return np.arange(first, first + count)

    def op(self, **cols) -> int:
        return int(self.ops(1, **cols)[0])

    def edges(self, src, dst) -> None:
        """Dependencies src[i] -> dst[i] (arrays or scalars, broadcast); op ids are int32, as
        the engine reads them."""
        src, dst = np.broadcast_arrays(np.asarray(src, dtype=np.int32), np.asarray(dst, dtype=np.int32))
        if src.size:
            self._esrc.append(src.ravel())
            self._edst.append(dst.ravel())

    def messages_between(self, topo, src, dst, nbytes, send_op, recv_op, kind: int = MSG_WRITE,
                         plane: str = "ub") -> None:
        """Messages src[i] -> dst[i]; send_op/recv_op are op indices (or -1) that carry them."""
        src = np.atleast_1d(np.asarray(src, dtype=np.int64))
        n = src.size
        send_op = np.broadcast_to(np.asarray(send_op, dtype=np.int64), (n,))
        recv_op = np.broadcast_to(np.asarray(recv_op, dtype=np.int64), (n,))
        self.messages.add_many(topo, src, np.broadcast_to(dst, (n,)), np.broadcast_to(nbytes, (n,)),
                               send_op, recv_op, kind=kind, plane=plane)

    def _take_column(self, name: str) -> np.ndarray:
        """One op column over every chunk (the default where a chunk does not give it); the
        chunks' own arrays for it are freed as it is joined."""
        dtype, default = _COLUMNS[name]
        out = np.full(self.n, default, dtype=dtype)
        at = 0
        for count, cols in self._chunks:
            if name in cols:
                out[at:at + count] = cols.pop(name)
            at += count
        return out

    def build(self, n_resources: int, die_aic, die_aiv, num_trace_ops: int):
        """The engine's arrays (``Lowered``). This empties the builder: its chunks, edge lists
        and messages are freed as the arrays are joined, so that the peak stays near the size of
        the result."""
        from cmemu.lower import Lowered

        if self._chunks is None:
            raise RuntimeError("this OpBuilder was already built")
        n = self.n
        messages = self.messages.arrays()
        msg = self._take_column("msg")
        # An op that carries messages and was not given one names one of them (the last).
        ids = np.arange(len(self.messages), dtype=np.int32)
        for key in ("msg_send_op", "msg_recv_op"):
            ops = messages[key]
            has = (ops >= 0) & (ops < n)
            has[has] = msg[ops[has]] < 0
            msg[ops[has]] = ids[has]
            del has
        del ids
        self.messages = None
        src = np.concatenate(self._esrc) if self._esrc else np.zeros(0, dtype=np.int32)
        self._esrc = None
        dst = np.concatenate(self._edst) if self._edst else np.zeros(0, dtype=np.int32)
        self._edst = None
        if src.size:
            # Grouped by source for the CSR lists. A repeated edge is harmless: it is counted in
            # the successor's predecessors and released as often.
            order = np.argsort(src, kind="stable")
            dst = dst[order]
            src = src[order]
            del order
        succ_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
        del src
        report = np.full(n, -1, dtype=np.int32)
        for op, start_from in self.report_start.items():
            report[op] = start_from
        columns = {name: self._take_column(name) for name in _COLUMNS if name != "msg"}
        self._chunks = None
        return Lowered(
            op_kind=columns["kind"],
            op_dur_ps=columns["dur"],
            op_lat_ps=columns["lat"],
            op_res=columns["res"],
            op_msg=msg,
            op_npred=np.bincount(dst, minlength=n).astype(np.int32),
            op_aic=columns["aic"],
            op_aiv=columns["aiv"],
            die_aic_cores=np.asarray(die_aic, dtype=np.int32),
            die_aiv_cores=np.asarray(die_aiv, dtype=np.int32),
            succ_ptr=succ_ptr,
            succ_idx=dst,
            **messages,
            n_resources=n_resources,
            op_node_id=columns["node_id"],
            op_type=columns["type"],
            op_rank=columns["rank"],
            op_stream=columns["stream"],
            op_bytes=columns["nbytes"],
            op_hbm_bytes=columns["hbm"],
            op_name=self.names,
            op_parent=columns["parent"],
            op_lane=columns["lane"],
            op_report_start=report,
            num_trace_ops=num_trace_ops,
        )
