"""The lowering's per-op lists: each op's successors, each op's messages, the message an op names.

Passes over the whole lowering (13 M ops, 20 M edges and 57 M messages on the 61-layer
DeepSeek-R1 decode step), as Numba kernels: linear in time (the lists are stable counting
sorts), checking the op ids as they go, with no temporaries the size of the input (numpy's
argsort and fancy indexing need several int64 copies of it: seconds and gigabytes at that
size). Each kernel has a numpy reference beside it (``*_reference``) that tests hold it to.
"""
from __future__ import annotations

import numpy as np
from numba import njit


def successor_csr(src, dst, n: int):
    """Edges src[i] -> dst[i] as CSR successor lists: ``(ptr int64[n + 1], idx int32[edges],
    npred int32[n])``. Each op's successors keep the order of their edges (a stable sort by
    ``src``); a repeated edge is kept, and counted in its successor's predecessors as often."""
    src = np.asarray(src, dtype=np.int32)
    dst = np.asarray(dst, dtype=np.int32)
    if src.shape != dst.shape:
        raise ValueError(f"{src.shape[0]} edge sources for {dst.shape[0]} successors")
    ptr, idx, npred, bad = _successor_csr(src, dst, n)
    if bad >= 0:
        what, op = ("successor", dst[bad]) if 0 <= src[bad] < n else ("source", src[bad])
        raise ValueError(f"an edge's {what} is op {int(op)}, outside the {n} ops")
    return ptr, idx, npred


@njit(cache=True)
def _successor_csr(src, dst, n):
    ptr = np.zeros(n + 1, np.int64)
    npred = np.zeros(n, np.int32)
    for e in range(src.shape[0]):
        s, d = src[e], dst[e]
        if s < 0 or s >= n or d < 0 or d >= n:
            return ptr, np.empty(0, np.int32), npred, e
        ptr[s + 1] += 1
        npred[d] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    idx = np.empty(src.shape[0], np.int32)
    fill = ptr[:n].copy()
    for e in range(src.shape[0]):
        s = src[e]
        idx[fill[s]] = dst[e]
        fill[s] += 1
    return ptr, idx, npred, -1


def predecessor_counts(idx, n: int):
    """How many times each of n ops appears in ``idx`` (int32[n]): its predecessors, from the
    successor lists."""
    idx = np.asarray(idx, dtype=np.int32)
    npred, bad = _predecessor_counts(idx, n)
    if bad >= 0:
        raise ValueError(f"an edge's successor is op {int(idx[bad])}, outside the {n} ops")
    return npred


@njit(cache=True)
def _predecessor_counts(idx, n):
    npred = np.zeros(n, np.int32)
    for e in range(idx.shape[0]):
        d = idx[e]
        if d < 0 or d >= n:
            return npred, e
        npred[d] += 1
    return npred, -1


def successor_csr_reference(src, dst, n: int):
    src = np.asarray(src, dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    idx = np.asarray(dst, dtype=np.int32)[np.argsort(src, kind="stable")]
    return ptr, idx, np.bincount(np.asarray(dst, dtype=np.int64), minlength=n).astype(np.int32)


def name_messages(msg, send_op, recv_op) -> None:
    """Give each op that carries messages and names none (``msg`` -1) one of them, in place: the
    last message it sends, else the last one it receives. Op ids outside the ops are ignored."""
    _name_messages(msg, np.asarray(send_op, dtype=np.int32), np.asarray(recv_op, dtype=np.int32))


@njit(cache=True)
def _name_messages(msg, send_op, recv_op):
    n = msg.shape[0]
    for ops in (send_op, recv_op):
        free = msg < 0  # before this pass: a sent message wins over a received one
        for m in range(ops.shape[0]):
            op = ops[m]
            if 0 <= op < n and free[op]:
                msg[op] = m


def name_messages_reference(msg, send_op, recv_op) -> None:
    n = msg.shape[0]
    for ops in (send_op, recv_op):
        ops = np.asarray(ops, dtype=np.int64)
        has = (ops >= 0) & (ops < n)
        has[has] = msg[ops[has]] < 0
        at = np.flatnonzero(has)
        msg[ops[at]] = at  # numpy keeps the last of repeated indices


def message_lists(kind, send_op, recv_op, send_kind: int, recv_kind: int):
    """The messages each op carries, as CSR ``(ptr int64[ops + 1], idx int32)``: an op of kind
    ``send_kind`` those whose ``send_op`` it is, one of ``recv_kind`` those whose ``recv_op`` it
    is, in id order (see cmemu._core.op_message_lists)."""
    kind = np.asarray(kind, dtype=np.uint8)
    send_op = np.asarray(send_op, dtype=np.int32)
    recv_op = np.asarray(recv_op, dtype=np.int32)
    if send_op.shape != recv_op.shape or send_kind == recv_kind:
        raise ValueError("message_lists needs a send and a receive op per message, and two kinds of op")
    ptr, idx, bad = _message_lists(kind, send_op, recv_op, send_kind, recv_kind)
    if bad >= 0:
        what, op = ("send", send_op[bad]) if not 0 <= send_op[bad] + 1 <= kind.shape[0] else ("receive", recv_op[bad])
        raise ValueError(f"a message's {what} op is op {int(op)}, outside the {kind.shape[0]} ops")
    return ptr, idx


@njit(cache=True)
def _message_lists(kind, send_op, recv_op, send_kind, recv_kind):
    # One pass to count (and check the ids: -1 or an op), one to fill. An op is of one kind, so
    # its messages all come from one of the two parts, in id order.
    n = kind.shape[0]
    ptr = np.zeros(n + 1, np.int64)
    for m in range(send_op.shape[0]):
        s, r = send_op[m], recv_op[m]
        if s < -1 or s >= n or r < -1 or r >= n:
            return ptr, np.empty(0, np.int32), m
        if s >= 0 and kind[s] == send_kind:
            ptr[s + 1] += 1
        if r >= 0 and kind[r] == recv_kind:
            ptr[r + 1] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    idx = np.empty(ptr[n], np.int32)
    fill = ptr[:n].copy()
    for m in range(send_op.shape[0]):
        s, r = send_op[m], recv_op[m]
        if s >= 0 and kind[s] == send_kind:
            idx[fill[s]] = m
            fill[s] += 1
        if r >= 0 and kind[r] == recv_kind:
            idx[fill[r]] = m
            fill[r] += 1
    return ptr, idx, -1


def message_lists_reference(kind, send_op, recv_op, send_kind: int, recv_kind: int):
    kind = np.asarray(kind)
    n = kind.shape[0]
    owners, ids = [], []
    for ops, want in ((np.asarray(send_op, dtype=np.int64), send_kind), (np.asarray(recv_op, dtype=np.int64), recv_kind)):
        has = ops >= 0
        has[has] = kind[ops[has]] == want
        owners.append(ops[has])
        ids.append(np.flatnonzero(has))
    owner, ids = np.concatenate(owners), np.concatenate(ids)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=ptr[1:])
    return ptr, ids[np.argsort(owner, kind="stable")].astype(np.int32)
