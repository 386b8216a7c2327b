"""COMM_SEND / COMM_RECV -> messages for the packet engine.

A matched send/receive pair becomes one message: its source and destination endpoints, size,
kind (a write, pushed by the sender), and path: the die-to-die link between the two dies of one
NPU, the RDMA plane when the nodes ask for ``cmemu.plane = "rdma"``, otherwise the UB fabric.
Packets, routes, credits and acks are the engine's business (``cmemu/_core/engine.pyx``); this
module only describes the messages, so lowering stays cheap however large they are.
"""
from __future__ import annotations

import numpy as np

from cmemu.lower.fabric import MSG_WRITE, PATH_D2D, PATH_RDMA, PATH_UB, PATH_VPC
from cmemu.topology import Topology

_HASH_MULT = 0x9E3779B1  # Knuth's multiplicative hash: spreads message numbers over paths


_COLUMNS = ("src", "dst", "nbytes", "kind", "path", "send_op", "recv_op")
# Stored as the engine reads them (26 B a message, not 56: a big lowering holds millions).
_DTYPES = {"src": np.int32, "dst": np.int32, "nbytes": np.int64, "kind": np.uint8, "path": np.uint8,
           "send_op": np.int32, "recv_op": np.int32}


class MessageTable:
    """Messages in the flat form the engine reads.

    Single messages (``add``) collect in lists, batches (``add_many``) as numpy chunks; both
    keep their order, and ``arrays()`` joins them once.
    """

    def __init__(self):
        self._rows = {c: [] for c in _COLUMNS}  # single messages not yet in a chunk
        self._chunks = []  # dicts of column arrays, in order
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def _flush(self) -> None:
        if self._chunks is None:
            raise RuntimeError("this MessageTable's arrays were already taken")
        if self._rows["src"]:
            self._chunks.append({c: np.asarray(v, dtype=_DTYPES[c]) for c, v in self._rows.items()})
            self._rows = {c: [] for c in _COLUMNS}

    def add(self, topo: Topology, src: int, dst: int, nbytes: int, plane: str, send_op: int, recv_op: int,
            kind: int = MSG_WRITE) -> int:
        if src == dst:
            raise ValueError(f"a message from endpoint {src} to itself")
        if plane == "rdma":
            path = PATH_RDMA
        elif plane == "vpc":
            path = PATH_VPC
        elif topo.is_twin(src, dst):
            path = PATH_D2D
        else:
            path = PATH_UB
        for c, v in zip(_COLUMNS, (src, dst, nbytes, kind, path, send_op, recv_op)):
            self._rows[c].append(int(v))
        self._n += 1
        return self._n - 1

    def add_many(self, topo: Topology, src, dst, nbytes, send_op, recv_op, kind: int = MSG_WRITE,
                 plane: str = "ub") -> None:
        """Add many messages at once (arrays of equal length); the same rules as ``add``."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        if np.any(src == dst):
            raise ValueError("a message from an endpoint to itself")
        dies = topo.num_dies
        if plane in ("rdma", "vpc"):
            path = np.full(src.shape, PATH_RDMA if plane == "rdma" else PATH_VPC)
        else:
            twin = (src < dies) & (dst < dies) & ((src ^ 1) == dst) if topo.spec.dies_per_npu == 2 else src < 0
            path = np.where(twin, PATH_D2D, PATH_UB)
        n = src.size
        if n < 64:  # a few: as single rows (a chunk of tiny arrays costs more than the rows)
            cols = (src, dst, np.broadcast_to(nbytes, (n,)), np.full(n, kind), path,
                    np.broadcast_to(send_op, (n,)), np.broadcast_to(recv_op, (n,)))
            for c, v in zip(_COLUMNS, cols):
                self._rows[c].extend(np.asarray(v, dtype=np.int64).tolist())
            self._n += n
            return
        self._flush()
        cols = {"src": src, "dst": dst, "path": path, "nbytes": nbytes, "kind": kind, "send_op": send_op,
                "recv_op": recv_op}
        # Ids and sizes of ops and endpoints fit int32 (the engine's own types).
        self._chunks.append({c: np.broadcast_to(np.asarray(v).astype(_DTYPES[c], copy=False), (n,))
                             for c, v in cols.items()})
        self._n += n

    def _take_column(self, name: str) -> np.ndarray:
        """Join one column of every chunk into one array, freeing the chunks' copies of it."""
        out = np.empty(self._n, dtype=_DTYPES[name])
        at = 0
        for chunk in self._chunks:
            part = chunk.pop(name)
            out[at:at + part.size] = part
            at += part.size
        return out

    def arrays(self) -> dict:
        """The messages as the engine's arrays (``Lowered.msg_*``). This empties the table: each
        column's chunks are freed as soon as the column is joined, so that a lowering of tens of
        millions of messages peaks near the size of the arrays themselves."""
        if self._chunks is None:
            raise RuntimeError("this MessageTable's arrays were already taken")
        self._flush()
        n = self._n
        out = {f"msg_{c}": self._take_column(c) for c in ("src", "dst", "nbytes", "kind", "path")}
        src, dst = out["msg_src"], out["msg_dst"]
        # A deterministic per-message hash picks the first path (plane, L2 chip) of a message:
        # (m * _HASH_MULT + src * 7919 + dst * 104729) mod 2**31, a block of messages at a time
        # (no temporaries the size of the whole table).
        h = np.empty(n, dtype=np.int64)
        block = 1 << 20
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            part = np.arange(lo, hi, dtype=np.uint64)
            part *= np.uint64(_HASH_MULT)
            part += src[lo:hi].astype(np.uint64) * np.uint64(7919)
            part += dst[lo:hi].astype(np.uint64) * np.uint64(104729)
            part %= np.uint64(2**31)
            h[lo:hi] = part  # below 2**31: the same value
        out["msg_bytes"] = out.pop("msg_nbytes")
        out["msg_hash"] = h
        out["msg_send_op"] = self._take_column("send_op")
        out["msg_recv_op"] = self._take_column("recv_op")
        self._chunks = None
        return {key: out[key] for key in ("msg_src", "msg_dst", "msg_bytes", "msg_kind", "msg_path", "msg_hash",
                                          "msg_send_op", "msg_recv_op")}
