"""The codes cmemu's layers share, in one place: the names a user chooses between (engines,
fabric models, timeline detail levels, compressions) and, for the engine, the integer codes of
op kinds, node types, pipes, packet and message kinds, planes and load-balancing modes.

Plain Python with no imports, below every layer (tests/test_layers.py): the trace checker, the
lowering, the engine (mirrored for Cython in cmemu/_core/vocab.pxd, checked equal by a test), the
timeline writer and reader and the CLI all read their codes from here.
"""
from __future__ import annotations

# -- what a run is asked for (`cmemu run` options) ---------------------------------------------
ENGINES = ("native", "reference")  # the Cython kernel, or its pure-Python reference
FABRICS = ("packet", "message", "message-bp")  # fabric models; cmemu.fabric.FABRIC_MODELS: each one's look-ahead
DETAILS = ("ops", "tasks", "packets")  # what the timeline records
COMPRESSIONS = ("gzip", "lzf", "none")  # of the timeline's datasets

# -- the trace (docs/trace-format.md) ------------------------------------------------------------
# Node types; also the timeline's op types (/ops/type, an HDF5 enum with these values).
NODE_TYPES = ("COMP", "COMM_SEND", "COMM_RECV", "MEM_LOAD", "MEM_STORE", "COMM_COLL")
NODE_TYPE_CODE = {name: i for i, name in enumerate(NODE_TYPES)}
COMP_UNITS = ("aic", "aiv")
COMP_DTYPES = ("bf16", "fp16", "int8", "fp32")
# Operators a COMP may name with cmemu.op: (unit whose cores cmemu.cores counts, required shape
# attributes, optional ones). The die model (cmemu/die) lowers each to a tile schedule.
_ROWS_COLS = ("aiv", ("cmemu.rows", "cmemu.cols"), ())
COMP_OPS = {
    "gemm": ("aic", ("cmemu.m", "cmemu.n", "cmemu.k"), ("cmemu.tile_m", "cmemu.tile_n")),
    "grouped_gemm": ("aic", ("cmemu.m", "cmemu.n", "cmemu.k", "cmemu.groups"), ("cmemu.tile_m", "cmemu.tile_n")),
    "mla_decode": ("aic", ("cmemu.tokens", "cmemu.kv_len"), ("cmemu.heads", "cmemu.queries_per_request")),
    "mla_attention": ("aic", ("cmemu.tokens", "cmemu.kv_len"), ("cmemu.heads", "cmemu.queries_per_request")),
    "mla_prefill": ("aic", ("cmemu.tokens",), ("cmemu.heads",)),
    "mla_prefill_attention": ("aic", ("cmemu.tokens", "cmemu.kv_len"), ("cmemu.heads",)),
    "gqa_attention": ("aic", ("cmemu.tokens", "cmemu.kv_len", "cmemu.heads", "cmemu.kv_heads", "cmemu.head_dim"),
                      ("cmemu.queries_per_request",)),
    "gqa_prefill_attention": ("aic", ("cmemu.tokens", "cmemu.kv_len", "cmemu.heads", "cmemu.kv_heads",
                                      "cmemu.head_dim"), ()),
    "rmsnorm": _ROWS_COLS,
    "rope": _ROWS_COLS,
    "swiglu": _ROWS_COLS,
    "softmax": _ROWS_COLS,
    "quant_int8": _ROWS_COLS,
}
# Ops that run on clusters of 1 AIC + 2 AIV: cmemu.cores counts the AIC, each holds its 2 AIV.
CLUSTER_OPS = frozenset({"mla_decode", "mla_attention", "mla_prefill", "mla_prefill_attention", "gqa_attention",
                         "gqa_prefill_attention"})
COMP_SHAPE_ATTRS = ("cmemu.m", "cmemu.n", "cmemu.k", "cmemu.groups", "cmemu.tile_m", "cmemu.tile_n",
                    "cmemu.tokens", "cmemu.kv_len", "cmemu.heads", "cmemu.kv_heads", "cmemu.head_dim",
                    "cmemu.queries_per_request", "cmemu.rows", "cmemu.cols")
# A message's plane (cmemu.plane), as a code: an index into this.
PLANES = ("ub", "rdma", "vpc")
MEM_PLANES = ("ub", "vpc")  # a MEM_LOAD from a CPU (cmemu.src_cpu): a CPU is on UB and VPC, not RDMA

# -- the engine (mirrored in cmemu/_core/vocab.pxd) ---------------------------------------------
# Op kinds: how the engine runs an op (a trace node's type, or a collective's internal op).
OP_KIND_COMP, OP_KIND_SEND, OP_KIND_RECV, OP_KIND_MEM = range(4)
# Pipes and engines of a die, as Ascend's own tools name them (CUBE, VECTOR, MTE1/2/3, FIXP), plus
# the two communication engines. /tasks/pipe stores the index into this tuple.
PIPE_NAMES = ("CUBE", "VECTOR", "MTE1", "MTE2", "MTE3", "FIXP", "SDMA", "AIV_DIRECT")
PIPE_CODE = {name: i for i, name in enumerate(PIPE_NAMES)}
# Path kinds: how a message travels.
PATH_UB, PATH_D2D, PATH_RDMA, PATH_VPC = range(4)
PATH_NAMES = ("ub", "d2d", "rdma", "vpc")
# Packet types: which header a packet carries (/packets/type with these names).
PKT_WRITE, PKT_READ_REQ, PKT_READ_RESP, PKT_ACK = range(4)
PACKET_TYPE_NAMES = ("WRITE", "READ_REQ", "READ_RESP", "ACK")
# Message kinds.
MSG_WRITE, MSG_READ, MSG_ATOMIC = range(3)
MSG_KIND_NAMES = ("write", "read", "atomic")
# UB load balancing (ub.load_balancing): per-packet spraying or per-flow hashing.
LOAD_BALANCING = ("spray", "hash")
LB_SPRAY, LB_HASH = range(2)
