"""The native core: the Cython event kernel (``engine``) and its pure-Python reference.

``make_engine(lowered, fabric, native=True)`` is the one way the rest of cmemu builds an engine.
"""


def make_engine(lowered, fabric, native: bool = True, bin_ps: int = 0):
    """An engine over lowered arrays and a fabric: the Cython kernel, or the pure-Python reference.

    ``bin_ps`` > 0 also collects per-link bytes and busy time in bins of that width.
    """
    if native:
        from cmemu._core.engine import Engine
    else:
        from cmemu._core.reference import Engine
    return Engine(lowered, fabric, bin_ps)


def op_message_lists(lowered):
    """The messages each SEND / RECV op carries, as CSR arrays ``(ptr int64[ops + 1], idx int32)``.

    A COMM_SEND op starts the write messages whose ``msg_send_op`` it is, and ends when all of
    them are acknowledged; a COMM_RECV op starts the read messages whose ``msg_recv_op`` it is,
    and ends when all its messages are delivered. Within an op, messages keep their order.
    """
    import numpy as np

    from cmemu.lower import OP_KIND_RECV, OP_KIND_SEND

    kind = lowered.op_kind
    n = int(kind.shape[0])
    m = np.arange(lowered.msg_send_op.shape[0], dtype=np.int64)
    owners, ids = [], []
    for ops, want in ((lowered.msg_send_op, OP_KIND_SEND), (lowered.msg_recv_op, OP_KIND_RECV)):
        ops = ops.astype(np.int64)
        has = ops >= 0
        has[has] = kind[ops[has]] == want
        owners.append(ops[has])
        ids.append(m[has])
    owner = np.concatenate(owners)
    idx = np.concatenate(ids)
    order = np.lexsort((idx, owner))
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=ptr[1:])
    carried = lowered.op_msg >= 0
    bad = carried & (ptr[1:] == ptr[:-1]) & ((kind == OP_KIND_SEND) | (kind == OP_KIND_RECV))
    if np.any(bad):
        bad = int(np.flatnonzero(bad)[0])
        raise ValueError(f"op {bad} names message {int(lowered.op_msg[bad])}, whose send/recv op is not it")
    return ptr, idx[order].astype(np.int32)
