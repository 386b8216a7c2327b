"""Synthetic engine workloads for benchmarks and equivalence tests (no trace file needed).

- ``hold_workload``: the classic "hold" model: ``chains`` independent chains of COMP ops with
  random durations, so about ``chains`` events stay pending the whole run and every event pops
  one and pushes one.
- ``traffic_workload``: random point-to-point messages between the dies of a topology, on the
  real routes, so that packet hops, link queueing and message delivery are exercised.
"""
from __future__ import annotations

import numpy as np

from cmemu.lower import OP_KIND_COMP, OP_KIND_RECV, OP_KIND_SEND, OP_TYPE_CODE, Lowered
from cmemu.lower.comm import MessageTable


def _lowered(kind, dur, succ_src, succ_dst, messages: MessageTable | None, link_rate, link_lat, op_msg=None, rank=None):
    n = len(kind)
    src = np.asarray(succ_src, dtype=np.int64)
    dst = np.asarray(succ_dst, dtype=np.int32)
    order = np.lexsort((dst, src))
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
    m = messages or MessageTable()
    kind = np.asarray(kind, dtype=np.uint8)
    type_of_kind = np.zeros(4, dtype=np.uint8)
    type_of_kind[[OP_KIND_COMP, OP_KIND_SEND, OP_KIND_RECV]] = [
        OP_TYPE_CODE["COMP"], OP_TYPE_CODE["COMM_SEND"], OP_TYPE_CODE["COMM_RECV"]]
    return Lowered(
        op_kind=kind,
        op_dur_ps=np.asarray(dur, dtype=np.int64),
        op_lat_ps=np.zeros(n, dtype=np.int64),
        op_res=np.full(n, -1, dtype=np.int32),
        op_msg=np.asarray(op_msg if op_msg is not None else np.full(n, -1), dtype=np.int32),
        op_npred=np.bincount(dst, minlength=n).astype(np.int32),
        succ_ptr=succ_ptr,
        succ_idx=dst[order].astype(np.int32),
        msg_send_op=np.asarray(m.send_op, dtype=np.int32),
        msg_recv_op=np.asarray(m.recv_op, dtype=np.int32),
        msg_chunk_ptr=np.asarray(m.chunk_ptr, dtype=np.int64),
        chunk_msg=np.asarray(m.chunk_msg, dtype=np.int32),
        chunk_bytes=np.asarray(m.chunk_bytes, dtype=np.int64),
        chunk_route_lo=np.asarray(m.chunk_route_lo, dtype=np.int64),
        chunk_route_hi=np.asarray(m.chunk_route_hi, dtype=np.int64),
        route_links=np.asarray(m.route_links, dtype=np.int32),
        link_rate_byte_per_s=np.asarray(link_rate, dtype=np.int64),
        link_latency_ps=np.asarray(link_lat, dtype=np.int64),
        n_resources=1,
        op_node_id=np.arange(n, dtype=np.int64),
        op_type=type_of_kind[kind],
        op_rank=np.asarray(rank if rank is not None else np.zeros(n), dtype=np.int32),
        op_stream=np.zeros(n, dtype=np.int32),
        op_bytes=np.zeros(n, dtype=np.int64),
        op_name=[f"op{i}" for i in range(n)],
        msg_bytes=np.asarray(m.nbytes, dtype=np.int64),
    )


def hold_workload(chains: int, ops_per_chain: int, seed: int = 0) -> Lowered:
    """``chains`` x ``ops_per_chain`` COMP ops; durations uniform in [1, 1000] ns."""
    rng = np.random.default_rng(seed)
    n = chains * ops_per_chain
    dur = rng.integers(1_000, 1_000_000, size=n, dtype=np.int64)
    ids = np.arange(n).reshape(chains, ops_per_chain)
    succ_src = ids[:, :-1].ravel()
    succ_dst = ids[:, 1:].ravel()
    return _lowered(np.full(n, OP_KIND_COMP), dur, succ_src, succ_dst, None, [1], [0])


def traffic_workload(topo, messages: int, max_bytes: int = 64 * 1024, seed: int = 0) -> Lowered:
    """Random sends between dies; each send/recv pair is independent of the others."""
    rng = np.random.default_rng(seed)
    table = MessageTable()
    kind, dur, op_msg, rank = [], [], [], []
    for _ in range(messages):
        src, dst = rng.choice(topo.num_dies, size=2, replace=False)
        nbytes = int(rng.integers(1, max_bytes))
        s = len(kind)
        m = table.add(topo, int(src), int(dst), nbytes, "ub", send_op=s, recv_op=s + 1)
        kind += [OP_KIND_SEND, OP_KIND_RECV]
        dur += [0, 0]
        op_msg += [m, m]
        rank += [int(src), int(dst)]
    return _lowered(kind, dur, [], [], table, topo.link_rate_byte_per_s, topo.link_latency_ps, op_msg=op_msg, rank=rank)
