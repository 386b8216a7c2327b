# The engine's codes, as cmemu/vocab.py defines them (the one home; this mirrors it for Cython).
# tests/test_vocab.py checks that every value here equals the Python one.

# Op kinds: how the engine runs an op.
cdef enum:
    OP_KIND_COMP = 0
    OP_KIND_SEND = 1
    OP_KIND_RECV = 2
    OP_KIND_MEM = 3

# Path kinds: how a message travels.
cdef enum:
    PATH_UB = 0
    PATH_D2D = 1
    PATH_RDMA = 2
    PATH_VPC = 3

# Packet types: which header a packet carries.
cdef enum:
    PKT_WRITE = 0
    PKT_READ_REQ = 1
    PKT_READ_RESP = 2
    PKT_ACK = 3

# Message kinds.
cdef enum:
    MSG_WRITE = 0
    MSG_READ = 1
    MSG_ATOMIC = 2

# UB load balancing.
cdef enum:
    LB_SPRAY = 0
    LB_HASH = 1
