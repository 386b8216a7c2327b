"""COMM_SEND / COMM_RECV -> messages for the packet engine.

A matched send/receive pair becomes one message: its source and destination endpoints, size,
kind (a write, pushed by the sender), and path: the die-to-die link between the two dies of one
NPU, the RDMA plane when the nodes ask for ``cmemu.plane = "rdma"``, otherwise the UB fabric.
Packets, routes, credits and acks are the engine's business (``cmemu/_core/engine.pyx``); this
module only describes the messages, so lowering stays cheap however large they are.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cmemu.lower.fabric import MSG_WRITE, PATH_D2D, PATH_RDMA, PATH_UB, PATH_VPC
from cmemu.topology import Topology

_HASH_MULT = 0x9E3779B1  # Knuth's multiplicative hash: spreads message numbers over paths


@dataclass
class MessageTable:
    """Messages in the flat form the engine reads."""

    src: list = field(default_factory=list)
    dst: list = field(default_factory=list)
    nbytes: list = field(default_factory=list)
    kind: list = field(default_factory=list)
    path: list = field(default_factory=list)
    send_op: list = field(default_factory=list)
    recv_op: list = field(default_factory=list)

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
        self.src.append(src)
        self.dst.append(dst)
        self.nbytes.append(nbytes)
        self.kind.append(kind)
        self.path.append(path)
        self.send_op.append(send_op)
        self.recv_op.append(recv_op)
        return len(self.src) - 1

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
        self.src.extend(src.tolist())
        self.dst.extend(dst.tolist())
        self.nbytes.extend(np.asarray(nbytes, dtype=np.int64).tolist())
        self.kind.extend([kind] * src.size)
        self.path.extend(path.tolist())
        self.send_op.extend(np.asarray(send_op, dtype=np.int64).tolist())
        self.recv_op.extend(np.asarray(recv_op, dtype=np.int64).tolist())

    def arrays(self) -> dict:
        n = len(self.src)
        src = np.asarray(self.src, dtype=np.int32)
        dst = np.asarray(self.dst, dtype=np.int32)
        # A deterministic per-message hash picks the first path (plane, L2 chip) of a message.
        h = (np.arange(n, dtype=np.uint64) * np.uint64(_HASH_MULT) + src.astype(np.uint64) * np.uint64(7919)
             + dst.astype(np.uint64) * np.uint64(104729)) % np.uint64(2**31)
        return {
            "msg_src": src,
            "msg_dst": dst,
            "msg_bytes": np.asarray(self.nbytes, dtype=np.int64),
            "msg_kind": np.asarray(self.kind, dtype=np.uint8),
            "msg_path": np.asarray(self.path, dtype=np.uint8),
            "msg_hash": h.astype(np.int64),
            "msg_send_op": np.asarray(self.send_op, dtype=np.int32),
            "msg_recv_op": np.asarray(self.recv_op, dtype=np.int32),
        }
