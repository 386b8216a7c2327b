"""Why a run cannot run or finish, in one line that names the op: a trace whose time could pass
the engine's clock (``check_clock_range``), an op on a failed die (``check_failed_dies``), a die
or every route lost during the run (``failed_die_error``, ``unroutable_error``), ops blocked for
ever (``describe_blocked``); and the invariants a finished run is checked against
(``check_invariants``, docs/architecture.md).
"""
from __future__ import annotations

import numpy as np

from cmemu.errors import SimulationError
from cmemu.lower import Lowered
from cmemu.results.result import RunResult
from cmemu.vocab import NODE_TYPES, OP_KIND_RECV, OP_KIND_SEND


# The engine's clock is an int64 count of picoseconds; a run whose worst case could pass 2**62 ps
# (about 53 days) is refused before it starts rather than wrapping round.
CLOCK_LIMIT_PS = 2**62


def check_clock_range(lowered: Lowered, fabric, where: str = "", nodes=None) -> None:
    """Refuse a run whose simulated time could overflow the engine's clock; the message names
    the file (``where``) and the trace node that takes the longest, and its field.

    The end of a run is a chain of activities (op durations, HBM accesses, packet hops), each
    counted once, so the sum of them all bounds it. Float arithmetic: only the order matters.
    """
    L, F = lowered, fabric
    total = float(L.op_dur_ps.sum(dtype=np.float64)) + float(L.op_lat_ps.sum(dtype=np.float64))
    if L.num_messages:
        # Packets: at most one more per message than its bytes over the smallest MTU.
        payload = float(L.bytes_sum(np.float64))
        packets = payload / float(F.path_mtu_byte.min()) + L.num_messages
        wire = payload + packets * float(F.path_header_byte.max() + F.path_flit_byte.max())
        hops = 2 * 4  # a read's request and response, at most four links each
        slowest = float(F.link_rate_byte_per_s.min())
        total += hops * wire * 1e12 / slowest
        per_packet = hops * float(F.link_latency_ps.max()) + float(F.ep_issue_ps.max())
        per_packet += float(F.ep_write_latency_ps.max() + F.ep_read_latency_ps.max())
        startup = float(F.ep_startup_ps.max()) + float(F.ini_msg_startup_ps.max())
        # An AIV's own work before a message (msg_prep) is counted once per message too.
        prep = float(L.prep_max())
        total += packets * per_packet + L.num_messages * (startup + prep)
    if total > CLOCK_LIMIT_PS:
        raise SimulationError(
            f"{where + ': ' if where else ''}the trace's ops and transfers add up to {total / 86400e12:,.0f} days of "
            f"simulated time in the worst case, beyond what the engine's clock holds (2**62 ps, about 53 days)"
            f"{_longest_op(L, nodes)}")


def _longest_op(L: Lowered, nodes=None) -> str:
    """'; the largest: node N (TYPE, field 'F', ...)', of the trace's ops by time alone or bytes
    (``nodes``: the trace's, to name a COMP's field)."""
    nt = L.num_trace_ops
    if not nt:
        return ""
    # Time of each trace op alone: its duration, or its bytes at 1 B/ps (a message's fastest).
    own = L.op_dur_ps[:nt].astype(np.float64) + L.op_lat_ps[:nt]
    moved = L.op_bytes[:nt].astype(np.float64)
    i = int(np.argmax(np.maximum(own, moved)))
    kind = NODE_TYPES[L.op_type[i]]
    field = {"COMP": "cmemu.duration_ns", "MEM_LOAD": "tensor_size", "MEM_STORE": "tensor_size"}.get(kind, "comm_size")
    if kind == "COMP" and nodes is not None and "cmemu.duration_ns" not in nodes[i].attrs:
        field = "cmemu.op" if "cmemu.op" in nodes[i].attrs else "num_ops"
    if kind == "COMP" and own[i] < moved[i]:
        field = "tensor_size"
    what = f"{own[i] / 86400e12:,.1f} days alone" if own[i] >= moved[i] else f"{int(moved[i]):,} B"
    return f"; the largest: node {L.op_node_id[i]} ({kind}, field '{field}', {what})"


def op_label(lowered: Lowered, i: int) -> str:
    if i >= lowered.num_trace_ops:
        parent = int(lowered.op_parent[i])
        return f"an internal op of {op_label(lowered, parent)}" if parent >= 0 else f"internal op {i}"
    return (f"node {lowered.op_node_id[i]} '{lowered.op_name[i]}' "
            f"({NODE_TYPES[lowered.op_type[i]]}, rank {lowered.op_rank[i]}, stream {lowered.op_stream[i]})")


def failed_die_error(lowered: Lowered, fabric, op: int) -> SimulationError:
    """The error of op ``op`` needing a die that failed during the run (the engine's DieFailedError)."""
    die = int(lowered.op_rank[op])
    when = int(fabric.fail_time_ps[fabric.fail_die == die].min())
    return SimulationError(f"{op_label(lowered, op)} needs die {die}, which failed at "
                           f"{when / 1e6:,.3f} us (the trace's cmemu.faults)")


def unroutable_error(engine, lowered: Lowered, fabric, msg: int, failed_parts: str = "--fail") -> SimulationError:
    """The error of message ``msg`` left without a path (the engine's UnroutableError);
    ``failed_parts`` says where the failed parts come from."""
    src, dst, _, _, _, send, recv = engine.message(msg)  # (the lowering may have dropped it)
    op = send if send >= 0 else recv
    # An end of the message on a die that failed during the run (a die failed from the start
    # has its ops refused before the run): say so, rather than a route.
    for end, role in ((dst, "its destination"), (src, "its source")):
        down = fabric.fail_time_ps[(fabric.fail_die == end) & (fabric.fail_time_ps <= engine.now)]
        if down.size:
            return SimulationError(
                f"a message from die {src} to die {dst} ({op_label(lowered, op)}) cannot be delivered: "
                f"die {end}, {role}, failed at {int(down.min()) / 1e6:,.3f} us (the trace's cmemu.faults)"
            )
    return SimulationError(
        f"a message from die {src} to die {dst} "
        f"({op_label(lowered, op)}) has no path left: every route crosses a failed part ({failed_parts})"
    )


def check_failed_dies(lowered: Lowered, failures, origin=None) -> None:
    """An op placed on a failed die cannot run: say which, before the run. ``origin``: die ->
    what failed it (default: --fail die:N)."""
    if not failures.dies:
        return
    on_dead = np.flatnonzero(np.isin(lowered.op_rank[:lowered.num_trace_ops], sorted(failures.dies)))
    if on_dead.size:
        i = int(on_dead[0])
        die = int(lowered.op_rank[i])
        more = f" (and {on_dead.size - 1} more ops)" if on_dead.size > 1 else ""
        why = (origin or {}).get(die, f"--fail die:{die}")
        raise SimulationError(f"{op_label(lowered, i)} needs die {die}, which has failed ({why}){more}")


def describe_blocked(lowered: Lowered, engine, limit: int = 8) -> str:
    """Name the ops that can never finish and why (a receive whose send never ran, ...)."""
    start = np.asarray(engine.op_start_ps)
    end = np.asarray(engine.op_end_ps)
    pending = np.asarray(engine.msg_pending)
    blocked = np.flatnonzero(end < 0)
    lines = []

    def label(i):
        return op_label(lowered, i)

    # Ops that started but cannot end: receives waiting for a message first, they are the roots.
    for i in blocked:
        if start[i] >= 0 and lowered.op_kind[i] == OP_KIND_RECV:
            # Its messages not yet delivered (a receive may wait for several); the engine's
            # copy of them (the lowering may have dropped a collective's).
            mine = np.asarray(engine.op_messages(int(i)), dtype=np.int64)
            for m in mine[pending[mine] > 0][:limit].tolist():
                src, _, _, _, _, s, _ = engine.message(m)
                if s < 0:  # a read: the receive started it, nobody sends
                    lines.append(f"{label(i)} waits for the data it reads from endpoint {src}")
                    continue
                state = "never started" if start[s] < 0 else "has not delivered it"
                lines.append(f"{label(i)} waits for its message from {label(s)}, which {state}")
    for i in blocked:
        if start[i] < 0 and len(lines) < limit:
            why = "waits for its dependencies"
            if lowered.op_kind[i] == OP_KIND_SEND:
                why = "never started: it waits for its dependencies or the previous op of its stream"
            lines.append(f"{label(i)} {why}")
    shown = lines[:limit]
    more = len(blocked) - len(shown)
    text = f"the run cannot finish: {len(blocked)} of {lowered.num_ops} ops are blocked: " + "; ".join(shown)
    if more > 0:
        text += f"; and {more} more"
    return text


def check_invariants(result: RunResult) -> None:
    """the invariants of docs/architecture.md that hold after a run: dependencies respected, bytes conserved."""
    from cmemu.lower.passes import early_successor

    L = result.lowered
    start, end = result.op_start_ps, result.op_end_ps
    if np.any(end < start):
        raise SimulationError("internal invariant broken: an op ended before it started")
    i, j = early_successor(L.succ_ptr, L.succ_idx, start, end)
    if i >= 0:
        def label(k):  # an internal op's node id is the engine's alone (drop_engine_inputs)
            return f"node {L.op_node_id[k]}" if k < L.num_trace_ops else op_label(L, k)

        raise SimulationError(f"internal invariant broken: {label(j)} started before its dependency {label(i)} ended")
    if L.num_messages and np.any(result.msg_delivered_ps < 0):
        raise SimulationError("internal invariant broken: a message was never delivered")
