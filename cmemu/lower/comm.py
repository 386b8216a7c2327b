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
        if self._rows["src"]:
            self._chunks.append({c: np.asarray(v, dtype=np.int64) for c, v in self._rows.items()})
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
        self._chunks.append({
            "src": src, "dst": dst, "path": path,
            "nbytes": np.broadcast_to(np.asarray(nbytes, dtype=np.int64), (n,)),
            "kind": np.full(n, kind, dtype=np.int64),
            "send_op": np.broadcast_to(np.asarray(send_op, dtype=np.int64), (n,)),
            "recv_op": np.broadcast_to(np.asarray(recv_op, dtype=np.int64), (n,)),
        })
        self._n += n

    def column(self, name: str) -> np.ndarray:
        self._flush()
        if not self._chunks:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.ravel(c[name]) for c in self._chunks])

    def arrays(self) -> dict:
        n = self._n
        src = self.column("src").astype(np.int32)
        dst = self.column("dst").astype(np.int32)
        # A deterministic per-message hash picks the first path (plane, L2 chip) of a message.
        h = (np.arange(n, dtype=np.uint64) * np.uint64(_HASH_MULT) + src.astype(np.uint64) * np.uint64(7919)
             + dst.astype(np.uint64) * np.uint64(104729)) % np.uint64(2**31)
        return {
            "msg_src": src,
            "msg_dst": dst,
            "msg_bytes": self.column("nbytes"),
            "msg_kind": self.column("kind").astype(np.uint8),
            "msg_path": self.column("path").astype(np.uint8),
            "msg_hash": h.astype(np.int64),
            "msg_send_op": self.column("send_op").astype(np.int32),
            "msg_recv_op": self.column("recv_op").astype(np.int32),
        }
