"""A run's packet records (``--detail packets``) as /packets rows (docs/timeline-format.md)."""
from __future__ import annotations

import numpy as np

from cmemu.results.result import RunResult


def packet_rows(full: RunResult, keep: np.ndarray) -> dict:
    """The engine's packet records (``engine.packet_records()``, messages of the lowering) as
    /packets rows: ``msg`` becomes the row in /messages (-1 for a message a collective made
    inside itself, which /messages does not list) and ``op`` the row in /ops of the trace op
    that moved it (the send of a write, the receive of a read, or the collective)."""
    from cmemu.vocab import MSG_WRITE

    L = full.lowered
    L.fill_messages()
    rec = full.packets
    m = np.asarray(rec["msg"], dtype=np.int64)
    new_id = np.cumsum(keep) - 1
    msg = np.where(keep[m], new_id[m], -1).astype(np.int32) if m.size else np.zeros(0, np.int32)
    # The op that moved each message: a write's send, a read's receive (the other if it has none).
    send, recv = L.msg_send_op.astype(np.int64), L.msg_recv_op.astype(np.int64)
    mover = np.where(L.msg_kind == MSG_WRITE, send, recv)
    mover = np.where(mover >= 0, mover, np.maximum(send, recv))
    nt = L.num_trace_ops
    inner = mover >= nt
    mover[inner] = L.op_parent[mover[inner]]
    rows = {"start_ps": np.asarray(rec["start_ps"], dtype=np.int64), "end_ps": np.asarray(rec["end_ps"], dtype=np.int64),
            "link": np.asarray(rec["link"], dtype=np.int32), "msg": msg,
            "op": mover[m].astype(np.int32), "seq": np.asarray(rec["seq"], dtype=np.int32),
            "wire_bytes": np.asarray(rec["wire_bytes"], dtype=np.int32),
            "type": np.asarray(rec["ptype"], dtype=np.uint8)}
    start = rows["start_ps"]
    if start.size > 1 and np.any(start[1:] < start[:-1]):
        # The message-level fabric records a packet's links when it reserves them, ahead of time.
        order = np.argsort(start, kind="stable")
        rows = {k: v[order] for k, v in rows.items()}
    return rows
