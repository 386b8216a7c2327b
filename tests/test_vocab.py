"""cmemu.vocab is the one home of the codes: the compiled engine (cmemu/_core/vocab.pxd and its
own constants), the trace schema, the spec and the fabric tables agree with it."""
import json

import pytest

import cmemu.vocab as V
from cmemu import fabric
from cmemu.lower import comm
from cmemu.trace.read import schema_path


def test_the_engine_compiled_the_python_codes():
    engine = pytest.importorskip("cmemu._core.engine")
    python = {name: getattr(V, name, None) for name in engine.engine_codes()}
    python.update(NUM_VLS=fabric.NUM_VLS, AIV_MESSAGES_IN_FLIGHT=fabric.AIV_MESSAGES_IN_FLIGHT,
                  FLOW_AFTER_MASK=comm.FLOW_AFTER_MASK, FLOW_BASE=comm.FLOW_BASE, PATH_HASH_MULT=fabric.PATH_HASH_MULT)
    assert engine.engine_codes() == python


def test_codes_index_their_names():
    assert V.PATH_NAMES[V.PATH_UB] == "ub" and V.PATH_NAMES[V.PATH_D2D] == "d2d"
    assert V.PATH_NAMES[V.PATH_RDMA] == "rdma" and V.PATH_NAMES[V.PATH_VPC] == "vpc"
    assert [V.PACKET_TYPE_NAMES[c] for c in (V.PKT_WRITE, V.PKT_READ_REQ, V.PKT_READ_RESP, V.PKT_ACK)] \
        == ["WRITE", "READ_REQ", "READ_RESP", "ACK"]
    assert [V.MSG_KIND_NAMES[c] for c in (V.MSG_WRITE, V.MSG_READ, V.MSG_ATOMIC)] == ["write", "read", "atomic"]
    assert V.LOAD_BALANCING[V.LB_SPRAY] == "spray" and V.LOAD_BALANCING[V.LB_HASH] == "hash"
    assert len({V.OP_KIND_COMP, V.OP_KIND_SEND, V.OP_KIND_RECV, V.OP_KIND_MEM}) == 4
    assert V.PIPE_CODE == {n: i for i, n in enumerate(V.PIPE_NAMES)}
    assert V.NODE_TYPE_CODE == {n: i for i, n in enumerate(V.NODE_TYPES)}


def test_the_trace_schema_names_the_node_types_and_planes():
    schema = json.loads(schema_path().read_text())
    text = json.dumps(schema)
    assert f'"enum": {json.dumps(list(V.NODE_TYPES))}' in text
    assert f'"enum": {json.dumps(list(V.PLANES))}' in text


def test_the_fabric_models_have_their_look_ahead():
    assert tuple(fabric.FABRIC_MODELS) == V.FABRICS == tuple(fabric.AIV_LOOKAHEAD_PS)


def test_the_die_pipes_are_named_in_the_vocabulary():
    from cmemu.die.model import AIC_PIPES, AIV_PIPES

    assert set(AIC_PIPES) | set(AIV_PIPES) <= set(V.PIPE_NAMES)
