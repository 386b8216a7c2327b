"""COMM_SEND / COMM_RECV -> messages for the packet engine.

A matched send/receive pair becomes one message: its source and destination endpoints, size,
kind (a write, pushed by the sender), and path: the die-to-die link between the two dies of one
NPU, the RDMA plane when the nodes ask for ``cmemu.plane = "rdma"``, otherwise the UB fabric.
Packets, routes, credits and acks are the engine's business (``cmemu/_core/engine.pyx``); this
module only describes the messages, so lowering stays cheap however large they are.
"""
from __future__ import annotations

import numpy as np

from cmemu.topology import Topology
from cmemu.vocab import MSG_WRITE, PATH_D2D, PATH_RDMA, PATH_UB, PATH_VPC, PLANES


_COLUMNS = ("src", "dst", "nbytes", "kind", "path", "send_op", "recv_op", "ini", "prep", "flow")
# Stored as the engine reads them (29 B a message: a big lowering holds millions). Endpoints and
# initiators are 16-bit ids (MAX_ENDPOINTS), op ids 32-bit.
#
# ``ini``: the initiator that issues the message: by default the die or CPU it leaves (a write) or
# reaches (a read: the reader); a vector core's own id (cmemu.fabric.aiv_initiator) for
# the remote reads and writes an AIV's MTE2/MTE3 issues itself (AIV-Direct). ``prep`` and
# ``flow`` order an AIV's stream of accesses as its kernel does (the engine reads them for AIV
# initiators only): ``prep`` ps of the core's own work before the message may go (loading and
# quantising a token), counted from when the last message marked FLOW_BASE before it was issued,
# or from its op's start; ``flow`` & FLOW_AFTER_MASK = k > 0: it waits until the message k places
# before it (of its initiator) is complete (acknowledged, or its read data back).
_DTYPES = {"src": np.uint16, "dst": np.uint16, "nbytes": np.int64, "kind": np.uint8, "path": np.uint8,
           "send_op": np.int32, "recv_op": np.int32, "ini": np.uint16, "prep": np.int32, "flow": np.uint8}
FLOW_AFTER_MASK = 0x07  # 1..7: wait for the message that many places before, at the same initiator
FLOW_BASE = 0x10  # later messages' prep counts from this one's issue
MAX_PREP_PS = 2**31 - 1
MAX_ENDPOINTS = 2**16
# The same as Lowered's message arrays, in their order.
MSG_COLUMNS = {f"msg_{'bytes' if c == 'nbytes' else c}": _DTYPES[c] for c in _COLUMNS}


def message_paths(topo: Topology, src, dst, plane):
    """How each message src[i] -> dst[i] travels (cmemu.vocab.PATH_*): the RDMA or VPC plane when its
    ``plane`` (a code of PLANES) asks for it, else the die-to-die link between the two dies of
    one NPU, else the UB fabric."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    path = np.where(topo.is_twin(src, dst), PATH_D2D, PATH_UB).astype(np.uint8)
    plane = np.broadcast_to(np.asarray(plane), path.shape)
    path[plane == PLANES.index("rdma")] = PATH_RDMA
    path[plane == PLANES.index("vpc")] = PATH_VPC
    return path


def _check_endpoints(ids) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= MAX_ENDPOINTS):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise ValueError(f"endpoint {bad}: cmemu numbers endpoints from 0 to {MAX_ENDPOINTS - 1:,} (16-bit ids)")


class Columns:
    """Named numpy columns of one length, appended to in batches.

    Each column is one array with room to spare, grown by an eighth when full: ``ndarray.resize``
    reallocates in place (the C library remaps a big array's pages instead of copying them), so
    the finished columns are handed over without a copy and without a second set of arrays at
    any time; ``take`` trims them to their length. The room is small because resize zero-fills
    it, which makes it resident. An ``OpBuilder`` block is built this way (a collective of one
    shape: a quarter of a million messages for an EP320 MoE dispatch); the lowering's result is
    assembled from the blocks at its final size (``builder.assemble``).
    """

    def __init__(self, dtypes: dict, defaults: dict | None = None):
        self._cols = {name: np.zeros(0, dtype=dtype) for name, dtype in dtypes.items()}
        self._defaults = defaults or {}
        self.n = 0
        self._room = 0

    def append(self, count: int, values: dict) -> None:
        """Append ``count`` rows: each column's value is a scalar or an array of ``count``; a
        column not given takes its default."""
        if self._cols is None:
            raise RuntimeError("these columns were already taken")
        end = self.n + count
        if end > self._room:
            self._room = max(end, self._room + self._room // 8, 1024)
            for col in self._cols.values():
                col.resize(self._room, refcheck=False)  # no views of a column are handed out
        for name, col in self._cols.items():
            col[self.n:end] = values[name] if name in values else self._defaults[name]
        self.n = end

    def take(self) -> dict:
        """The columns, trimmed to their length; the object is empty afterwards."""
        if self._cols is None:
            raise RuntimeError("these columns were already taken")
        cols, self._cols = self._cols, None
        for col in cols.values():
            col.resize(self.n, refcheck=False)
        return cols


class MessageTable:
    """Messages in the flat form the engine reads.

    Single messages (``add``) collect in lists until the next batch (``add_many``) or the end;
    both keep their order. ``arrays()`` hands the columns over (once).
    """

    def __init__(self):
        self._rows = {c: [] for c in _COLUMNS}  # single messages not yet in the columns
        self._cols = Columns(_DTYPES)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def _append(self, count: int, cols: dict) -> None:
        self._cols.append(count, cols)

    def _flush(self) -> None:
        if self._rows["src"]:
            rows, self._rows = self._rows, {c: [] for c in _COLUMNS}
            self._append(len(rows["src"]), {c: np.asarray(v, dtype=_DTYPES[c]) for c, v in rows.items()})

    def add(self, topo: Topology, src: int, dst: int, nbytes: int, plane: str, send_op: int, recv_op: int,
            kind: int = MSG_WRITE) -> int:
        if src == dst:
            raise ValueError(f"a message from endpoint {src} to itself")
        _check_endpoints(np.array([src, dst]))
        path = int(message_paths(topo, src, dst, PLANES.index(plane)))
        ini = src if kind == MSG_WRITE else dst
        for c, v in zip(_COLUMNS, (src, dst, nbytes, kind, path, send_op, recv_op, ini, 0, 0)):
            self._rows[c].append(int(v))
        self._n += 1
        return self._n - 1

    def add_many(self, topo: Topology, src, dst, nbytes, send_op, recv_op, kind: int = MSG_WRITE,
                 plane="ub", ini=None, prep=0, flow=0) -> None:
        """Add many messages at once (arrays of equal length); the same rules as ``add``. ``plane``
        is a plane's name, or per message a code of PLANES; ``ini``, ``prep`` and ``flow`` as the
        columns say (ini None: the natural initiator)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        if np.any(src == dst):
            raise ValueError("a message from an endpoint to itself")
        _check_endpoints(src)
        _check_endpoints(dst)
        path = message_paths(topo, src, dst, PLANES.index(plane) if isinstance(plane, str) else plane)
        n = src.size
        self._flush()
        if ini is None:
            ini = src if kind == MSG_WRITE else dst
        else:
            ini = np.broadcast_to(np.asarray(ini, dtype=np.int64), (n,))
            _check_endpoints(ini)
        prep = np.asarray(prep, dtype=np.int64)
        if prep.size and (prep.min() < 0 or prep.max() > MAX_PREP_PS):
            raise ValueError(f"a message's preparation time must be 0 to {MAX_PREP_PS:,} ps")
        # Op ids fit int32 (the engine's own type).
        self._append(n, {"src": src, "dst": dst, "path": path, "nbytes": nbytes, "kind": kind, "send_op": send_op,
                         "recv_op": recv_op, "ini": ini, "prep": prep, "flow": flow})
        self._n += n

    def arrays(self) -> dict:
        """The messages as the engine's arrays (``Lowered.msg_*``); the table is empty afterwards."""
        self._flush()
        cols = self._cols.take()
        return {name: cols[c] for name, c in zip(MSG_COLUMNS, _COLUMNS)}
