"""Lowering: a validated trace plus a topology -> the flat typed arrays the core engine reads.

Each op becomes one engine op with a kind, a duration or a message; dependencies (data, control
and stream order) become a CSR successor list and a count of predecessors. Python objects never
reach the engine. The mechanisms live in ``compute`` (COMP), ``memory`` (MEM_*), ``comm`` (COMM_*).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cmemu.lower.comm import MessageTable
from cmemu.lower.compute import comp_duration_ps
from cmemu.lower.memory import hbm_latency_ps, hbm_service_ps
from cmemu.topology import Topology

OP_KIND_COMP, OP_KIND_SEND, OP_KIND_RECV, OP_KIND_MEM = range(4)

# Trace node types as stored in the timeline (an HDF5 enum with these values).
OP_TYPES = ("COMP", "COMM_SEND", "COMM_RECV", "MEM_LOAD", "MEM_STORE")
OP_TYPE_CODE = {name: i for i, name in enumerate(OP_TYPES)}
_KIND_OF_TYPE = {
    "COMP": OP_KIND_COMP,
    "COMM_SEND": OP_KIND_SEND,
    "COMM_RECV": OP_KIND_RECV,
    "MEM_LOAD": OP_KIND_MEM,
    "MEM_STORE": OP_KIND_MEM,
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
    succ_ptr: np.ndarray  # int64 [ops + 1]
    succ_idx: np.ndarray  # int32 [edges]
    msg_src: np.ndarray  # int32 [msgs]: endpoint the data leaves
    msg_dst: np.ndarray  # int32 [msgs]: endpoint the data reaches
    msg_bytes: np.ndarray  # int64 [msgs]
    msg_kind: np.ndarray  # uint8 [msgs]: fabric.MSG_WRITE / MSG_READ
    msg_path: np.ndarray  # uint8 [msgs]: fabric.PATH_UB / PATH_D2D / PATH_RDMA
    msg_hash: np.ndarray  # int64 [msgs]: picks the message's first path
    msg_send_op: np.ndarray  # int32 [msgs]: -1 if none
    msg_recv_op: np.ndarray  # int32 [msgs]: -1 if none
    n_resources: int
    # Metadata for the timeline (not read by the engine).
    op_node_id: np.ndarray  # int64 [ops]
    op_type: np.ndarray  # uint8 [ops]: index into OP_TYPES
    op_rank: np.ndarray  # int32 [ops]
    op_stream: np.ndarray  # int32 [ops]
    op_bytes: np.ndarray  # int64 [ops]
    op_name: list

    @property
    def num_ops(self) -> int:
        return int(self.op_kind.shape[0])

    @property
    def num_messages(self) -> int:
        return int(self.msg_send_op.shape[0])



def _op_bytes(node) -> int:
    a = node.attrs
    if node.type in ("COMM_SEND", "COMM_RECV"):
        return int(a["comm_size"])
    return int(a.get("tensor_size", 0))


def lower(trace, topo: Topology) -> Lowered:
    """Lower a validated trace (``cmemu.trace.Trace``) onto a topology."""
    from cmemu.trace import match_messages, stream_predecessors

    die = topo.spec.die
    nodes = trace.nodes
    n = len(nodes)
    index = {node.id: i for i, node in enumerate(nodes)}
    kind = np.empty(n, dtype=np.uint8)
    dur = np.zeros(n, dtype=np.int64)
    lat = np.zeros(n, dtype=np.int64)
    res = np.full(n, -1, dtype=np.int32)
    msg_of = np.full(n, -1, dtype=np.int32)
    op_type = np.empty(n, dtype=np.uint8)
    rank = np.empty(n, dtype=np.int32)
    stream = np.empty(n, dtype=np.int32)
    nbytes = np.empty(n, dtype=np.int64)
    node_id = np.empty(n, dtype=np.int64)
    names = []
    mem_latency = (hbm_latency_ps(die, store=False), hbm_latency_ps(die, store=True))
    for i, node in enumerate(nodes):
        kind[i] = _KIND_OF_TYPE[node.type]
        op_type[i] = OP_TYPE_CODE[node.type]
        rank[i] = node.rank
        stream[i] = node.stream
        node_id[i] = node.id
        nbytes[i] = _op_bytes(node)
        names.append(node.name)
        if node.type == "COMP":
            dur[i] = comp_duration_ps(node, die, trace.path)
        elif kind[i] == OP_KIND_MEM:
            dur[i] = hbm_service_ps(nbytes[i], die, store=node.type == "MEM_STORE")
            lat[i] = mem_latency[node.type == "MEM_STORE"]
            res[i] = node.rank  # one HBM server per die

    messages = MessageTable()
    for send_id, recv_id in match_messages(trace):
        s, r = index[send_id], index[recv_id]
        send = nodes[s]
        m = messages.add(
            topo,
            src=send.rank,
            dst=nodes[r].rank,
            nbytes=int(send.attrs["comm_size"]),
            plane=send.attrs.get("cmemu.plane", "ub"),
            send_op=s,
            recv_op=r,
        )
        msg_of[s] = msg_of[r] = m

    # Edges pred -> succ: data deps, control deps and stream order, without duplicates.
    preds = stream_predecessors(trace)
    src_list, dst_list = [], []
    for i, node in enumerate(nodes):
        deps = set(node.data_deps)
        deps.update(node.ctrl_deps)
        prev = preds.get(node.id)
        if prev is not None:
            deps.add(prev)
        for d in deps:
            src_list.append(index[d])
            dst_list.append(i)
    src_arr = np.asarray(src_list, dtype=np.int64)
    dst_arr = np.asarray(dst_list, dtype=np.int32)
    order = np.lexsort((dst_arr, src_arr))
    succ_idx = dst_arr[order].astype(np.int32)
    counts = np.bincount(src_arr, minlength=n) if n else np.zeros(0, dtype=np.int64)
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=succ_ptr[1:])
    npred = np.bincount(dst_arr, minlength=n).astype(np.int32) if n else np.zeros(0, dtype=np.int32)

    return Lowered(
        op_kind=kind,
        op_dur_ps=dur,
        op_lat_ps=lat,
        op_res=res,
        op_msg=msg_of,
        op_npred=npred,
        succ_ptr=succ_ptr,
        succ_idx=succ_idx,
        **messages.arrays(),
        n_resources=topo.num_dies,
        op_node_id=node_id,
        op_type=op_type,
        op_rank=rank,
        op_stream=stream,
        op_bytes=nbytes,
        op_name=names,
    )


def lowered_from_parts(kind, dur, succ_src, succ_dst, messages: MessageTable | None, op_msg=None, rank=None) -> Lowered:
    """Engine input built directly, without a trace: for scenarios, benchmarks and tests.

    ``kind`` and ``dur`` per op (OP_KIND_*, picoseconds), dependency edges ``succ_src`` ->
    ``succ_dst`` (op indices), and the messages the SEND/RECV ops carry (``op_msg``).
    """
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
        **m.arrays(),
        n_resources=1,
        op_node_id=np.arange(n, dtype=np.int64),
        op_type=type_of_kind[kind],
        op_rank=np.asarray(rank if rank is not None else np.zeros(n), dtype=np.int32),
        op_stream=np.zeros(n, dtype=np.int32),
        op_bytes=np.zeros(n, dtype=np.int64),
        op_name=[f"op{i}" for i in range(n)],
    )
