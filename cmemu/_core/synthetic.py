"""Synthetic engine workloads for benchmarks and equivalence tests (no trace file needed).

- ``hold_workload``: the classic "hold" model: ``chains`` independent chains of COMP ops with
  random durations, so about ``chains`` events stay pending the whole run and every event pops
  one and pushes one.
- ``traffic_workload``: random point-to-point messages between the dies of a topology, on the
  real routes, so that packet hops, link queueing and message delivery are exercised.
"""
from __future__ import annotations

import numpy as np

from cmemu.lower import lowered_from_parts
from cmemu.lower.comm import MessageTable
from cmemu.vocab import OP_KIND_COMP, OP_KIND_RECV, OP_KIND_SEND


def hold_workload(chains: int, ops_per_chain: int, seed: int = 0) -> Lowered:
    """``chains`` x ``ops_per_chain`` COMP ops; durations uniform in [1, 1000] ns."""
    rng = np.random.default_rng(seed)
    n = chains * ops_per_chain
    dur = rng.integers(1_000, 1_000_000, size=n, dtype=np.int64)
    ids = np.arange(n).reshape(chains, ops_per_chain)
    succ_src = ids[:, :-1].ravel()
    succ_dst = ids[:, 1:].ravel()
    return lowered_from_parts(np.full(n, OP_KIND_COMP), dur, succ_src, succ_dst, None)


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
    return lowered_from_parts(kind, dur, [], [], table, op_msg=op_msg, rank=rank)
