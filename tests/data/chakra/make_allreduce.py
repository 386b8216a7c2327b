"""Writes allreduce.0.et and allreduce.1.et: a two-rank Chakra execution trace built with
mlc-chakra's protobuf classes (et_def.proto) and length-prefixed messages (its protolib), as
Chakra's own generator (chakra/src/generator/generator.py) writes them. Run from this folder:
    python make_allreduce.py
Each rank: a COMP of 10 us (duration_micros, as ASTRA-sim replays it), a MEM_LOAD of 1 MiB, an
ALL_REDUCE of 1 MiB over process group "tp" depending on both, then a COMP with num_ops and
tensor_size (a roofline op); rank 0 sends 64 KiB to rank 1 (comm_tag 3) after it.
"""
from chakra.schema.protobuf.et_def_pb2 import (ALL_REDUCE, COMM_COLL_NODE, COMM_RECV_NODE, COMM_SEND_NODE,
                                               COMP_NODE, MEM_LOAD_NODE, METADATA_NODE, AttributeProto,
                                               GlobalMetadata, Node)
from chakra.src.third_party.utils.protolib import encodeMessage


def node(id, name, type, data=(), ctrl=(), **attrs):
    n = Node(id=id, name=name, type=type)
    n.data_deps.extend(data)
    n.ctrl_deps.extend(ctrl)
    n.attr.append(AttributeProto(name="is_cpu_op", bool_val=False))
    for key, (field, value) in attrs.items():
        n.attr.append(AttributeProto(name=key, **{field: value}))
    return n


for rank in (0, 1):
    nodes = [
        node(0, "metadata", METADATA_NODE),
        node(1, "embed", COMP_NODE),
        node(2, "load_weights", MEM_LOAD_NODE, tensor_size=("uint64_val", 1 << 20)),
        node(3, "allreduce_grad", COMM_COLL_NODE, data=(1, 2), comm_type=("int64_val", ALL_REDUCE),
             comm_size=("int64_val", 1 << 20), pg_name=("string_val", "tp")),
        node(4, "mlp", COMP_NODE, data=(3,), num_ops=("int64_val", 2 * 1024 * 7168 * 2048),
             tensor_size=("uint64_val", 2 * 7168 * 2048)),
    ]
    nodes[1].duration_micros = 10
    if rank == 0:
        nodes.append(node(5, "send_act", COMM_SEND_NODE, ctrl=(4,), comm_dst=("int32_val", 1),
                          comm_size=("int64_val", 65536), comm_tag=("int32_val", 3)))
    else:
        nodes.append(node(5, "recv_act", COMM_RECV_NODE, ctrl=(4,), comm_src=("int32_val", 0),
                          comm_size=("int64_val", 65536), comm_tag=("int32_val", 3)))
    with open(f"allreduce.{rank}.et", "wb") as f:
        encodeMessage(f, GlobalMetadata(version="0.0.4"))
        for n in nodes:
            encodeMessage(f, n)
