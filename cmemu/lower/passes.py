"""Passes over the whole lowering: each op's successors and predecessor count, each op's
messages, the message an op names, each op's HBM demand; a placed block's op ids.

They run over 13 M ops, 20 M edges and 57 M messages on the 61-layer DeepSeek-R1 decode step,
so they are Numba kernels: linear in time (the lists are stable counting sorts), checking the op
ids as they go, with no temporaries the size of the input (numpy's argsort, fancy indexing and
masked arithmetic need several int64 copies of it: seconds and gigabytes at that size, new
memory being slow to touch on the development VM). Each kernel has a numpy reference beside it
(``*_reference``) that tests hold it to.
"""
from __future__ import annotations

import numpy as np
from cmemu.kernels import njit


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


def name_messages(msg, send_op, recv_op, segments=None) -> None:
    """Give each op that carries messages and names none (``msg`` -1) one of them, in place: the
    last message it sends, else the last one it receives. Op ids outside the ops are ignored.
    ``segments``: the messages' segments when the copies' ops are not written (see
    ``message_segments``)."""
    send_op, recv_op = np.asarray(send_op, dtype=np.int32), np.asarray(recv_op, dtype=np.int32)
    _name_messages(msg, send_op, recv_op, message_segments(segments, send_op.shape[0]))


@njit(cache=True)
def _name_messages(msg, send_op, recv_op, segs):
    n = msg.shape[0]
    for ops in (send_op, recv_op):
        free = msg < 0  # before this pass: a sent message wins over a received one
        for g in range(segs.shape[0]):
            lo, tpl, shift = segs[g, 0], segs[g, 2], segs[g, 3]
            for j in range(segs[g, 1]):
                op = ops[tpl + j]
                if op >= 0:
                    op += shift
                if 0 <= op < n and free[op]:
                    msg[op] = lo + j


def name_messages_reference(msg, send_op, recv_op) -> None:
    n = msg.shape[0]
    for ops in (send_op, recv_op):
        ops = np.asarray(ops, dtype=np.int64)
        has = (ops >= 0) & (ops < n)
        has[has] = msg[ops[has]] < 0
        at = np.flatnonzero(has)
        msg[ops[at]] = at  # numpy keeps the last of repeated indices


def shift_own(rel, own, base: int, out) -> None:
    """``out = where(own, rel + base, rel)`` in one pass, in place (int32): a block's own op ids
    moved to where it is placed, the others kept (cmemu.lower.builder)."""
    _shift_own(rel, own, np.int32(base), out)


@njit(cache=True, nogil=True)
def _shift_own(rel, own, base, out):
    for i in range(rel.shape[0]):
        out[i] = rel[i] + base if own[i] else rel[i]


def shift_own_reference(rel, own, base: int, out) -> None:
    out[:] = np.where(own, rel + base, rel)


def message_segments(segments, n_messages: int) -> np.ndarray:
    """The segments the kernels read the messages' send and receive ops through: int64
    ``[segments, 4]`` rows (first message, count, first message of its template, op shift), as
    ``Lowered.msg_segments``, for a lowering that left its copies' ops unwritten (msg_filled
    False): a copy's ops are its template's, shifted, read from the template (a few megabytes,
    in cache, where the copies' columns are hundreds). None: the columns are whole, one segment
    of its own."""
    if segments is None:
        return np.array([[0, n_messages, 0, 0]], dtype=np.int64)
    return np.ascontiguousarray(segments, dtype=np.int64)


def message_ends(send_op, recv_op, segments, m: int) -> tuple[int, int]:
    """Message m's (send op, receive op), through ``segments`` (as the kernels read them)."""
    segs = message_segments(segments, len(send_op))
    g = int(np.searchsorted(segs[:, 0], m, side="right")) - 1
    lo, _, tpl, shift = (int(v) for v in segs[g])
    s, r = int(send_op[tpl + m - lo]), int(recv_op[tpl + m - lo])
    return (s + shift if s >= 0 else s), (r + shift if r >= 0 else r)


def message_lists(kind, send_op, recv_op, send_kind: int, recv_kind: int, segments=None):
    """The messages each op carries, as CSR ``(ptr int64[ops + 1], idx int32)``: an op of kind
    ``send_kind`` those whose ``send_op`` it is, one of ``recv_kind`` those whose ``recv_op`` it
    is, in id order (see cmemu._core.op_message_lists). ``segments``: see ``message_segments``."""
    kind = np.asarray(kind, dtype=np.uint8)
    send_op = np.asarray(send_op, dtype=np.int32)
    recv_op = np.asarray(recv_op, dtype=np.int32)
    if send_op.shape != recv_op.shape or send_kind == recv_kind:
        raise ValueError("message_lists needs a send and a receive op per message, and two kinds of op")
    segs = message_segments(segments, send_op.shape[0])
    if segments is not None:
        ptr, idx, copied = _copied_lists(kind, send_op, recv_op, segs, send_kind, recv_kind)
        if copied:
            return ptr, idx
        del ptr, idx
    ptr, idx, bad = _message_lists(kind, send_op, recv_op, segs, send_kind, recv_kind)
    if bad >= 0:
        s, r = message_ends(send_op, recv_op, segments, bad)
        what, op = ("send", s) if not 0 <= s + 1 <= kind.shape[0] else ("receive", r)
        raise ValueError(f"a message's {what} op is op {int(op)}, outside the {kind.shape[0]} ops")
    return ptr, idx


@njit(cache=True)
def _message_lists(kind, send_op, recv_op, segs, send_kind, recv_kind):
    # One pass to count (and check the ids: -1 or an op), one to fill. An op is of one kind, so
    # its messages all come from one of the two parts, in id order. The fill moves each op's
    # start up to its end, so ptr[op + 1] is counted and ptr[op] filled from (no second array).
    n = kind.shape[0]
    ptr = np.zeros(n + 1, np.int64)
    for g in range(segs.shape[0]):
        lo, tpl, shift = segs[g, 0], segs[g, 2], segs[g, 3]
        for j in range(segs[g, 1]):
            s, r = np.int64(send_op[tpl + j]), np.int64(recv_op[tpl + j])
            if s >= 0:
                s += shift
            if r >= 0:
                r += shift
            if s < -1 or s >= n or r < -1 or r >= n:
                return ptr, np.empty(0, np.int32), lo + j
            if s >= 0 and kind[s] == send_kind:
                ptr[s + 1] += 1
            if r >= 0 and kind[r] == recv_kind:
                ptr[r + 1] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    idx = np.empty(ptr[n], np.int32)
    for g in range(segs.shape[0]):
        lo, tpl, shift = segs[g, 0], segs[g, 2], segs[g, 3]
        for j in range(segs[g, 1]):
            s, r = np.int64(send_op[tpl + j]), np.int64(recv_op[tpl + j])
            if s >= 0:
                s += shift
            if r >= 0:
                r += shift
            if s >= 0 and kind[s] == send_kind:
                idx[ptr[s]] = lo + j
                ptr[s] += 1
            if r >= 0 and kind[r] == recv_kind:
                idx[ptr[r]] = lo + j
                ptr[r] += 1
    for i in range(n, 0, -1):  # each start is now the next op's: move them back
        ptr[i] = ptr[i - 1]
    ptr[0] = 0
    return ptr, idx, -1


@njit(cache=True)
def _own_ends(kind, ops, want, lo, cnt, g, first, last, counts, counted):
    # An own segment's ops of one end, counted as _message_lists does; False for an op outside.
    n = kind.shape[0]
    for j in range(cnt):
        o = ops[lo + j]
        if o < -1 or o >= n:
            return False
        if o >= 0:
            first[g] = min(first[g], o)
            last[g] = max(last[g], o)
            if kind[o] == want:
                counts[o + 1] += 1
                counted[g] += 1
    return True


@njit(cache=True)
def _copied_lists(kind, send_op, recv_op, segs, send_kind, recv_kind):
    # _message_lists where a copy's lists are its template's, shifted: each segment of its own
    # counted and filled message by message, then a copy's counts and lists block copies of its
    # template's (the ops between the least and the largest its messages name), its ids moved by
    # its offset: sequential, where message by message each is a random access. The third value
    # False whenever that does not hold exactly (an op outside, a copy's ops not of its
    # template's kinds, or lists that would mix two segments' messages): _message_lists then
    # makes them, and names the first bad message.
    n, k = kind.shape[0], segs.shape[0]
    counts = np.zeros(n + 1, np.int64)
    first = np.full(k, n, np.int64)
    last = np.full(k, -1, np.int64)
    counted = np.zeros(k, np.int64)
    of = np.full(k, -1, np.int64)  # a copy's template segment
    for g in range(k):
        lo, cnt, tpl, shift = segs[g, 0], segs[g, 1], segs[g, 2], segs[g, 3]
        if tpl == lo:
            if shift != 0:
                return counts, np.empty(0, np.int32), False
            if not _own_ends(kind, send_op, send_kind, lo, cnt, g, first, last, counts, counted):
                return counts, np.empty(0, np.int32), False
            if not _own_ends(kind, recv_op, recv_kind, lo, cnt, g, first, last, counts, counted):
                return counts, np.empty(0, np.int32), False
        else:
            t = np.searchsorted(segs[:, 0], tpl)
            if t >= k or segs[t, 0] != tpl or segs[t, 2] != tpl or segs[t, 1] != cnt or t > g:
                return counts, np.empty(0, np.int32), False
            of[g] = t
    for g in range(k):  # a template's span counts its own messages only
        if of[g] < 0 and last[g] >= first[g] and counts[first[g] + 1:last[g] + 2].sum() != counted[g]:
            return counts, np.empty(0, np.int32), False
    for g in range(k):
        t = of[g]
        if t < 0 or last[t] < first[t]:
            continue
        a, b, shift = first[t], last[t], segs[g, 3]
        if a + shift < 0 or b + shift >= n:
            return counts, np.empty(0, np.int32), False
        for o in range(a, b + 1):
            if kind[o + shift] != kind[o] or counts[o + shift + 1] != 0:
                return counts, np.empty(0, np.int32), False
        for o in range(a, b + 1):
            counts[o + shift + 1] = counts[o + 1]
    for g in range(k):  # and still does, with the copies' counts in
        if of[g] < 0 and last[g] >= first[g] and counts[first[g] + 1:last[g] + 2].sum() != counted[g]:
            return counts, np.empty(0, np.int32), False
    ptr = counts
    for i in range(n):
        ptr[i + 1] += ptr[i]
    idx = np.empty(ptr[n], np.int32)
    fill = ptr[:n].copy()
    for g in range(k):
        if of[g] >= 0:
            continue
        lo = segs[g, 0]
        for j in range(segs[g, 1]):
            s, r = send_op[lo + j], recv_op[lo + j]
            if s >= 0 and kind[s] == send_kind:
                idx[fill[s]] = lo + j
                fill[s] += 1
            if r >= 0 and kind[r] == recv_kind:
                idx[fill[r]] = lo + j
                fill[r] += 1
    for g in range(k):
        t = of[g]
        if t < 0 or last[t] < first[t]:
            continue
        a, b, shift, moved = first[t], last[t], segs[g, 3], segs[g, 0] - segs[g, 2]
        at = ptr[a + shift]
        for i in range(ptr[a], ptr[b + 1]):
            idx[at] = idx[i] + moved
            at += 1
    return ptr, idx, True


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


def hbm_demand(kind, dur_ps, hbm_byte, rank, cap, kinds, aic=None, aiv=None, aic_move=None, aiv_move=None) -> np.ndarray:
    """Each op's HBM demand in bytes/s (int64[ops], 0 for none): an op of one of ``kinds`` with
    HBM bytes and a duration draws its bytes over its duration, rounded up, at least 1 and at
    most its die's capacity ``cap[rank]`` (ranks outside the dies count as the nearest die); an
    op on a die of capacity 0 takes no part (cmemu._core.hbm_sharing). With core counts
    (``aic``, ``aiv`` per op) and what one core of each moves (``aic_move``, ``aiv_move`` per
    die, bytes/s), also at most what its cores move: aic x aic_move + aiv x aiv_move (an op
    with no cores, a DMA or MEM op, is bounded by its own rate only)."""
    kinds = np.asarray(kinds, dtype=np.uint8)
    n = np.asarray(kind).shape[0]
    if aic is None:
        aic = aiv = np.zeros(0, dtype=np.int32)
        aic_move = aiv_move = np.zeros(0, dtype=np.int64)
    return _hbm_demand(np.asarray(kind, dtype=np.uint8), np.asarray(dur_ps, dtype=np.int64),
                       np.asarray(hbm_byte, dtype=np.int64), np.asarray(rank, dtype=np.int32),
                       np.asarray(cap, dtype=np.int64), kinds, _cores(aic, n), _cores(aiv, n),
                       _per_die(aic_move, cap), _per_die(aiv_move, cap))


def _cores(x, n):
    x = np.asarray(x, dtype=np.int32)
    if x.shape[0] not in (0, n):
        raise ValueError(f"hbm_demand: core counts for {x.shape[0]} ops, not {n}")
    return x


def _per_die(x, cap):
    x = np.zeros(0, dtype=np.int64) if x is None else np.asarray(x, dtype=np.int64)
    out = np.zeros(np.asarray(cap).shape[0], dtype=np.int64)
    out[:min(x.shape[0], out.shape[0])] = x[:out.shape[0]]
    return out


@njit(cache=True)
def _hbm_demand(kind, dur, hbm, rank, cap, kinds, aic, aiv, aic_move, aiv_move):
    n, dies = kind.shape[0], cap.shape[0]
    rate = np.zeros(n, np.int64)
    if dies == 0:
        return rate
    cores = aic.shape[0] > 0
    for i in range(n):
        if hbm[i] <= 0 or dur[i] <= 0:
            continue
        takes_part = False
        for k in kinds:
            takes_part = takes_part or kind[i] == k
        r = min(max(rank[i], 0), dies - 1)
        if takes_part and cap[r] > 0:
            # In double precision, as the reference's numpy expression: the same rounding.
            demand = np.ceil(hbm[i] / dur[i] * 1e12)
            rate[i] = np.int64(min(max(demand, 1.0), np.float64(cap[r])))
            if cores:
                most = np.int64(aic[i]) * aic_move[r] + np.int64(aiv[i]) * aiv_move[r]
                if most > 0 and rate[i] > most:
                    rate[i] = most
    return rate


def hbm_demand_reference(kind, dur_ps, hbm_byte, rank, cap, kinds, aic=None, aiv=None, aic_move=None,
                         aiv_move=None) -> np.ndarray:
    dies = cap.shape[0]
    rank = np.clip(rank, 0, max(dies - 1, 0))
    takes_part = np.isin(kind, kinds) & (hbm_byte > 0) & (dur_ps > 0) & (cap[rank] > 0 if dies else False)
    rate = np.zeros(dur_ps.shape[0], dtype=np.int64)
    most = cap[rank[takes_part]].astype(np.float64)
    rate[takes_part] = np.clip(np.ceil(hbm_byte[takes_part] / dur_ps[takes_part] * 1e12), 1, most).astype(np.int64)
    if aic is not None and dies:
        move = (np.asarray(aic, dtype=np.int64) * _per_die(aic_move, cap)[rank]
                + np.asarray(aiv, dtype=np.int64) * _per_die(aiv_move, cap)[rank])
        capped = takes_part & (move > 0)
        rate[capped] = np.minimum(rate[capped], move[capped])
    return rate


def early_successor(succ_ptr, succ_idx, start, end) -> tuple[int, int]:
    """The first op with a successor that started before it ended, and that successor (the first
    such in its list): ``(op, successor)``, or ``(-1, -1)`` when every dependency held. For
    cmemu.run.diagnostics.check_invariants, after a run: no per-edge temporaries."""
    i, j = _early_successor(succ_ptr, succ_idx, start, end)
    return int(i), int(j)


@njit(cache=True)
def _early_successor(ptr, idx, start, end):
    for i in range(ptr.shape[0] - 1):
        for k in range(ptr[i], ptr[i + 1]):
            if start[idx[k]] < end[i]:
                return i, idx[k]
    return -1, -1


def early_successor_reference(succ_ptr, succ_idx, start, end) -> tuple[int, int]:
    # Each op's earliest successor start against its end.
    has = np.flatnonzero(succ_ptr[1:] > succ_ptr[:-1])
    first = np.minimum.reduceat(start[succ_idx[:succ_ptr[-1]]], succ_ptr[has]) if has.size else start[:0]
    late = has[first < end[has]]
    if not late.size:
        return -1, -1
    i = int(late[0])
    succ = succ_idx[succ_ptr[i]:succ_ptr[i + 1]]
    return i, int(succ[np.flatnonzero(start[succ] < end[i])[0]])


def leading_kept(send_op, recv_op, n_ops: int, segments=None) -> int:
    """How many of the first messages have both their send and their receive op among the first
    ``n_ops`` ops (Lowered.leading_trace_messages); -1 if some message after them has too.
    ``segments``: see ``message_segments``."""
    send_op, recv_op = np.asarray(send_op), np.asarray(recv_op)
    return int(_leading_kept(send_op, recv_op, message_segments(segments, send_op.shape[0]), n_ops))


@njit(cache=True)
def _leading_kept(send, recv, segs, nt):
    k = 0
    leading = True
    for g in range(segs.shape[0]):
        tpl, shift = segs[g, 2], segs[g, 3]
        for j in range(segs[g, 1]):
            s, r = np.int64(send[tpl + j]), np.int64(recv[tpl + j])
            if s >= 0:
                s += shift
            if r >= 0:
                r += shift
            kept = 0 <= s < nt and 0 <= r < nt
            if leading and kept:
                k += 1
            elif kept:
                return -1
            else:
                leading = False
    return k


def leading_kept_reference(send_op, recv_op, n_ops: int) -> int:
    keep = (send_op >= 0) & (send_op < n_ops) & (recv_op >= 0) & (recv_op < n_ops)
    k = int(np.count_nonzero(keep))
    return k if keep[:k].all() else -1
