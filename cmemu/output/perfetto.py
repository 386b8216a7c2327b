"""Export a timeline to the Chrome trace-event JSON format (gzipped), which Perfetto opens.

Layout of the trace:
- one process per die, named "node N / NPU K / die J" and sorted by die index (so by node);
  processes for CPUs and switch chips follow, holding the counters of their links;
- in a die's process, one thread per stream ("stream S") with a complete event ("X") per op, then
  one thread per pipe/engine ("CUBE", "MTE2", ...) with a complete event per task when the
  timeline has tasks. Events that overlap on one stream or pipe (tasks of several cores on one
  pipe) go to extra lanes ("CUBE #2", ...), so that every thread holds properly nested events;
- a flow arrow per message, from its COMM_SEND (at the send's start) to its COMM_RECV (at the
  later of the receive's start and the send's start, bound to the enclosing receive slice);
- a flow arrow per rank and MoE exchange (v4 /moe_pairs), from the rank's MOE_DISPATCH (its
  start: its tokens leave) to the MOE_COMBINE that brings them back (bound to that slice): a
  token's round trip as its rank sees it. Which holders served it is in the collective's tasks
  (AIV_DIRECT / SDMA), not arrows: one per (rank, holder) pair would be thousands per layer;
- counters ("C") of each link's bandwidth in GB/s per time bin, when the timeline has binned
  link counters (/links/binned), in the process of the die or switch the link belongs to; and
  of each die's HBM bandwidth ("HBM GB/s", /dies/hbm_binned) and, in v4, each of its stacks'
  ("HBM stack S GB/s", /dies/hbm_stack_binned), in the die's process;
- when the timeline has /packets (``cmemu run --detail packets``), a thread per link that carried
  packets ("link 1008 d2d: node 0 / NPU 0 / die 0 -> node 0 / NPU 0 / die 1"), in the process
  that shows the link's counter, after the die's streams and pipes, with a complete event per
  transmission of a packet on the link ("WRITE send_act": the packet type and the op that moved
  it). A link serialises one packet at a time, so its packets never overlap; should they, they go
  to extra lanes like the tasks. Packets count in the event budget; when they alone would take
  the trace past it, they are left out with a warning and ``otherData.packets`` says so.

Timestamps in the format are microseconds; cmemu's integer picoseconds are written exactly as
decimal microseconds with six digits (``ps // 10**6`` "." ``ps % 10**6``); the trace asks the viewer
to display nanoseconds. Events are written in timestamp order, one chunk at a time.

Files older than v4 have no /moe_pairs: their traces get no dispatch->combine arrows (the
trace's ``otherData.moe_flows`` says so).
"""
from __future__ import annotations

import contextlib
import gzip
import heapq
import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cmemu.errors import CmemuError
from cmemu.output.atomic import atomic_open
from cmemu.vocab import PACKET_TYPE_NAMES, PIPE_NAMES

DEFAULT_MAX_EVENTS = 2_000_000
_WRITE_ROWS = 1 << 16
_PH_X, _PH_S, _PH_F, _PH_C = range(4)


class ExportError(CmemuError):
    """The export would be too large, or the window is malformed."""


@dataclass
class ExportInfo:
    path: Path
    events: int  # events written (metadata included)
    timed_events: int  # events written, without the metadata (names, sort order)
    timed_events_total: int  # timed events of the whole run, without a window
    window_ps: tuple[int, int] | None
    op_events: int
    task_events: int
    flows: int  # message flows and dispatch->combine flows
    counter_events: int
    moe_flows: int = 0  # of the flows, dispatch->combine
    packet_events: int = 0  # transmissions of packets on links (/packets), as X events
    packets: str = ""  # what the trace holds of /packets (otherData.packets)


# The engine's clock is an int64 count of picoseconds of at most 2**62 (cmemu.run.diagnostics.CLOCK_LIMIT_PS):
# a window is a span of that clock.
WINDOW_LIMIT_PS = 2**62


def parse_window(text: str | None) -> tuple[int, int] | None:
    """'START_US:END_US' (microseconds, decimals allowed) -> (start_ps, end_ps), both within the
    clock (0 to 2**62 ps)."""
    if text is None:
        return None
    shown = repr(text) if len(str(text)) <= 60 else repr(str(text)[:57] + "...")
    parts = str(text).split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        lo_us, hi_us = (float(p) for p in parts)
    except ValueError:
        raise ExportError(f"--window {shown}: write START_US:END_US in microseconds, e.g. 100:250.5") from None
    limit_us = WINDOW_LIMIT_PS / 1e6
    if not (0 <= lo_us <= limit_us and 0 <= hi_us <= limit_us):  # NaN fails both
        raise ExportError(f"--window {shown}: times must be numbers from 0 to {limit_us:,.0f} us "
                          "(2**62 ps, what the clock holds)")
    lo, hi = round(lo_us * 1e6), round(hi_us * 1e6)
    if not lo < hi:
        raise ExportError(f"--window {shown}: need 0 <= START_US < END_US")
    return lo, hi


def _us(ps: np.ndarray) -> list[str]:
    """Integer picoseconds as exact decimal microseconds."""
    ps = np.asarray(ps, dtype=np.int64)
    whole, frac = np.divmod(ps, 1_000_000)
    return [f"{w}.{f:06d}" for w, f in zip(whole.tolist(), frac.tolist())]


def assign_lanes(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A lane per interval such that intervals of one (track, lane) never overlap.

    Greedy interval partitioning in start order: an interval takes the lowest-numbered lane of
    its track that is free by its start, else a new lane. Tracks whose intervals are
    already sequential (streams) all get lane 0 without the Python loop.
    """
    n = start.size
    lanes = np.zeros(n, dtype=np.int32)
    if n == 0:
        return lanes
    order = np.lexsort((end, start, track))
    tr, s, e = track[order], start[order], end[order]
    first = np.ones(n, dtype=bool)
    first[1:] = tr[1:] != tr[:-1]
    # Running max of ends within each track (offset per track so the max restarts).
    grp = np.cumsum(first) - 1
    span = int(e.max()) + 1
    if grp[-1] * span < 2**62:
        runmax = np.maximum.accumulate(e + grp * span) - grp * span
        prev = np.empty(n, dtype=np.int64)
        prev[0] = -1
        prev[1:] = runmax[:-1]
        overlap = (~first) & (s < prev)
        bad_tracks = np.unique(tr[overlap])
    else:
        bad_tracks = np.unique(tr)
    if bad_tracks.size == 0:
        return lanes
    sel = np.flatnonzero(np.isin(tr, bad_tracks))
    out = np.zeros(sel.size, dtype=np.int32)
    busy: list = []  # (end, lane) of the lanes in use
    free: list = []  # lanes free again, lowest first, so lane 0 stays the fullest
    current = None
    count = 0
    for j, i in enumerate(sel.tolist()):
        t = tr[i]
        if t != current:
            current, busy, free, count = t, [], [], 0
        while busy and busy[0][0] <= s[i]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane, count = count, count + 1
        heapq.heappush(busy, (int(e[i]), lane))
        out[j] = lane
    lanes_sorted = np.zeros(n, dtype=np.int32)
    lanes_sorted[sel] = out
    lanes[order] = lanes_sorted
    return lanes


def export_perfetto(timeline, out_path, max_events: int = DEFAULT_MAX_EVENTS, window: str | None = None) -> ExportInfo:
    """Write ``timeline`` (a path or an open Timeline) as gzipped Chrome trace JSON to ``out_path``."""
    from cmemu.output.atomic import check_output
    from cmemu.output.reader import Timeline, open_timeline

    # Before any work: a target that cannot be written, or that is the timeline itself.
    check_output(out_path, inputs=(timeline.path if isinstance(timeline, Timeline) else timeline,))
    t = timeline if isinstance(timeline, Timeline) else open_timeline(timeline)
    try:
        return _export(t, Path(out_path), int(max_events), parse_window(window))
    finally:
        if t is not timeline:
            t.close()


def _export(t, out: Path, max_events: int, win: tuple[int, int] | None) -> ExportInfo:
    from cmemu.output.reader import _enum_names

    ops = t.columns("ops")
    msgs = t.columns("messages")
    n_ops = ops["rank"].size
    tasks = t.columns("tasks") if t.version >= 2 else {"die": np.zeros(0, np.int32)}
    n_tasks = tasks["die"].size
    links = t.columns("links")
    bins = t.columns("links/binned") if t.has_link_bins() else None
    bin_ps = t.link_bin_ps
    pk = t.columns("packets") if t.has_packets() else None
    n_pkt = pk["link"].size if pk is not None else 0

    # -- which events, and how many -------------------------------------------------------
    def in_window(start, end):
        if win is None:
            return np.ones(start.size, dtype=bool)
        return (end >= win[0]) & (start <= win[1])

    keep_op = in_window(ops["start_ps"], ops["end_ps"])
    keep_task = in_window(tasks["start_ps"], tasks["end_ps"]) if n_tasks else np.zeros(0, bool)
    vnames = t.vertex_names()
    if bins is not None or n_pkt:
        # A link's counter and its packets' thread both show in the process of link_owner.
        endpoints = t.dies_count + int(t.spec["nodes"]) * int(t.spec["cpus_per_node"])
        link_owner, link_names = _link_owner_and_names(links, vnames, endpoints, t.link_kinds)
    # Counters: one row per sample, c_owner (vertex whose process shows it), c_name (index into
    # counter_names, JSON literals), c_ts, c_val (GB/s).
    counter_names: list[str] = []
    c_parts = []
    if bins is not None:
        rows = _counter_rows(bins["link"], bins["bin"], bins["bytes"], bin_ps)
        counter_names.extend(link_names)
        c_parts.append((link_owner[rows["key"]], rows["key"], rows["ts_ps"], rows["gbyte_per_s"], bin_ps))
    hbm_counters = "not recorded"
    if t.has_hbm_bins():
        # HBM bandwidth per die, and per stack when the file has it (v4): tracks beside the links'.
        h = t.columns("dies/hbm_binned")
        hb_ps = t.hbm_bin_ps
        base = len(counter_names)
        counter_names.extend(json.dumps("HBM GB/s") for _ in range(t.dies_count))
        rows = _counter_rows(h["die"], h["bin"], h["bytes"], hb_ps)
        c_parts.append((rows["key"], base + rows["key"], rows["ts_ps"], rows["gbyte_per_s"], hb_ps))
        hbm_counters = "GB/s per die and bin"
        if t.has_hbm_stack_bins():
            st = t.columns("dies/hbm_stack_binned")
            stacks = t.hbm_stacks
            base = len(counter_names)
            counter_names.extend(json.dumps(f"HBM stack {k} GB/s") for _ in range(t.dies_count) for k in range(stacks))
            key = st["die"].astype(np.int64) * stacks + st["stack"]
            rows = _counter_rows(key, st["bin"], st["bytes"], hb_ps)
            c_parts.append((rows["key"] // stacks, base + rows["key"], rows["ts_ps"], rows["gbyte_per_s"], hb_ps))
            hbm_counters = "GB/s per die, and per stack, and bin"
    if c_parts:
        c_owner, c_name, c_ts, c_val = (np.concatenate([p[i] for p in c_parts]) for i in range(4))
        c_owner, c_name, c_ts = c_owner.astype(np.int64), c_name.astype(np.int64), c_ts.astype(np.int64)
        c_width = np.concatenate([np.full(p[0].size, p[4], dtype=np.int64) for p in c_parts])
        keep_c = in_window(c_ts, c_ts + (0 if win is None else c_width))
    else:
        c_owner = c_name = c_ts = np.zeros(0, dtype=np.int64)
        c_val = np.zeros(0)
        keep_c = np.zeros(0, dtype=bool)
    # Flows: each message send -> receive, then (v4) each rank's MoE dispatch -> its combine.
    pairs = t.columns("moe_pairs") if t.has_moe_pairs() else {"dispatch_op": np.zeros(0, np.int32),
                                                             "combine_op": np.zeros(0, np.int32)}
    fl_src = np.concatenate([msgs["send_op"], pairs["dispatch_op"]]).astype(np.int64)
    fl_dst = np.concatenate([msgs["recv_op"], pairs["combine_op"]]).astype(np.int64)
    fl_moe = np.concatenate([np.zeros(msgs["send_op"].size, bool), np.ones(pairs["dispatch_op"].size, bool)])
    keep_msg = keep_op[fl_src] & keep_op[fl_dst]
    keep_pkt = in_window(pk["start_ps"], pk["end_ps"]) if n_pkt else np.zeros(0, dtype=bool)
    total = n_ops + n_tasks + 2 * fl_src.size + keep_c.size + n_pkt
    kept = int(keep_op.sum() + keep_task.sum() + 2 * keep_msg.sum() + keep_c.sum())
    kept_pkt = int(keep_pkt.sum())
    end_us = t.sim_end_ps / 1e6
    if pk is None:
        packets_note = ("not recorded (the run was written without --detail packets)" if t.version >= 4
                        else f"not in layout version {t.version} (v4 records them with --detail packets)")
    elif kept <= max_events < kept + kept_pkt:
        # The packets alone pass the limit: the rest is worth having without them.
        where = "the trace" if win is None else "the window"
        packets_note = (f"left out: {kept_pkt:,} packet events would take {where} to {kept + kept_pkt:,} events, "
                        f"above the limit of {max_events:,} (--max-events); "
                        + ("pass --window START_US:END_US to keep them over a time window"
                           if win is None else "narrow the window") + " or raise --max-events")
        warnings.warn(f"cmemu export perfetto: packets {packets_note}", stacklevel=3)
        keep_pkt[:] = False
        kept_pkt = 0
    else:
        packets_note = (f"{n_pkt:,} transmissions on {np.unique(pk['link']).size:,} links, a thread per link"
                        if win is None else f"{kept_pkt:,} of {n_pkt:,} transmissions, in the window")
    kept += kept_pkt
    if kept > max_events:
        if win is None:
            raise ExportError(
                f"the trace would hold {total:,} events, above the limit of {max_events:,} (--max-events); "
                f"pass --window START_US:END_US to keep a time window (the run spans 0 to {end_us:,.3f} us), "
                "or raise --max-events")
        raise ExportError(
            f"the window {win[0] / 1e6:,.3f}:{win[1] / 1e6:,.3f} us still holds {kept:,} events, above the "
            f"limit of {max_events:,} (--max-events); narrow the window or raise --max-events")

    # -- tracks: (pid, thread label) -> tid -----------------------------------------------
    # pid = vertex + 1 (dies first, in node order); tids are given per process in label order.
    # A thread's key is vertex << 48 plus its local key: streams, then pipes (from 1 << 40), then
    # links (from 2 << 40), each with its lanes.
    dies = t.dies_count
    op_rank, op_stream = ops["rank"].astype(np.int64), ops["stream"].astype(np.int64)
    max_stream = int(op_stream.max()) + 1 if n_ops else 1
    op_lane = assign_lanes(op_rank * max_stream + op_stream, ops["start_ps"], ops["end_ps"])
    t_die = tasks["die"].astype(np.int64) if n_tasks else np.zeros(0, np.int64)
    t_pipe = tasks["pipe"].astype(np.int64) if n_tasks else np.zeros(0, np.int64)
    task_lane = (assign_lanes(t_die * len(PIPE_NAMES) + t_pipe, tasks["start_ps"], tasks["end_ps"])
                 if n_tasks else np.zeros(0, np.int32))
    p_link = pk["link"].astype(np.int64) if n_pkt else np.zeros(0, np.int64)
    p_owner = link_owner[p_link] if n_pkt else np.zeros(0, np.int64)
    pkt_lane = assign_lanes(p_link, pk["start_ps"], pk["end_ps"]) if n_pkt else np.zeros(0, np.int32)
    # Thread order within a die: streams (then their overflow lanes), then pipes, then links.
    stream_key = op_stream * 1024 + op_lane
    pipe_key = (1 << 40) + t_pipe * 1024 + task_lane
    link_key = (2 << 40) + p_link * 1024 + pkt_lane
    keys = np.concatenate([op_rank[keep_op] * (1 << 48) + stream_key[keep_op],
                           t_die[keep_task] * (1 << 48) + pipe_key[keep_task],
                           p_owner[keep_pkt] * (1 << 48) + link_key[keep_pkt]])
    uniq = np.unique(keys)
    u_vertex = uniq >> 48
    u_local = uniq & ((1 << 48) - 1)
    first_of_vertex = np.concatenate([[True], u_vertex[1:] != u_vertex[:-1]]) if uniq.size else np.zeros(0, bool)
    tid_of = np.arange(uniq.size) - np.maximum.accumulate(np.where(first_of_vertex, np.arange(uniq.size), 0)) + 1

    def tid_for(k):
        # Rows outside the window have no thread and get an arbitrary one; they are never written.
        if uniq.size == 0:
            return np.zeros(k.size, dtype=np.int64)
        return tid_of[np.minimum(np.searchsorted(uniq, k), uniq.size - 1)]

    op_tid = tid_for(op_rank * (1 << 48) + stream_key)
    task_tid = tid_for(t_die * (1 << 48) + pipe_key)
    pkt_tid = tid_for(p_owner * (1 << 48) + link_key)

    def thread_label(local: int) -> str:
        if local < (1 << 40):
            stream, lane = divmod(local, 1024)
            return f"stream {stream}" + (f" (overlap lane {lane + 1})" if lane else "")
        if local < (2 << 40):
            pipe, lane = divmod(local - (1 << 40), 1024)
            return PIPE_NAMES[pipe] + (f" #{lane + 1}" if lane else "")
        link, lane = divmod(local - (2 << 40), 1024)
        src, dst = int(links["src_vertex"][link]), int(links["dst_vertex"][link])
        return (f"link {link} {t.link_kinds[links['kind'][link]]}: {vnames[src]} -> {vnames[dst]}"
                + (f" #{lane + 1}" if lane else ""))

    meta = []
    used_pids = set((u_vertex + 1).tolist())
    used_pids.update((c_owner[keep_c] + 1).tolist())
    for pid in sorted(used_pids):
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": str(vnames[pid - 1])}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for v, local, tid in zip(u_vertex.tolist(), u_local.tolist(), tid_of.tolist()):
        meta.append({"ph": "M", "name": "thread_name", "pid": v + 1, "tid": tid, "args": {"name": thread_label(local)}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": v + 1, "tid": tid, "args": {"sort_index": tid}})

    # -- the timed events, in one order ---------------------------------------------------
    # X events sort by (start, duration): on one lane, a zero-length op that starts where a longer
    # one starts comes first, as it ran first. A flow start follows its send's X event and a flow
    # end its receive's X event (or the flow start), so each binds to the slice it belongs to.
    no_rows = np.zeros(0, np.int64)
    x_ts = np.concatenate([ops["start_ps"], tasks["start_ps"] if n_tasks else no_rows,
                           pk["start_ps"] if n_pkt else no_rows])
    x_end = np.concatenate([ops["end_ps"], tasks["end_ps"] if n_tasks else no_rows, pk["end_ps"] if n_pkt else no_rows])
    x_keep = np.concatenate([keep_op, keep_task, keep_pkt])
    x_order = np.lexsort((np.arange(x_ts.size), x_end - x_ts, x_ts))
    pos = np.empty(x_ts.size, dtype=np.int64)
    pos[x_order] = np.arange(x_ts.size)
    m = np.flatnonzero(keep_msg)
    s_op, r_op = fl_src[m], fl_dst[m]
    s_ts = ops["start_ps"][s_op]
    f_ts = np.maximum(ops["start_ps"][r_op], s_ts)
    s_key = 2 * pos[s_op] + 1
    f_key = np.where(ops["start_ps"][r_op] < s_ts, 2 * pos[s_op] + 2, np.maximum(2 * pos[r_op] + 1, 2 * pos[s_op] + 2))
    xi = np.flatnonzero(x_keep)
    ci = np.flatnonzero(keep_c)
    ev_ts = np.concatenate([x_ts[xi], s_ts, f_ts, c_ts[ci]])
    ev_key = np.concatenate([2 * pos[xi], s_key, f_key, np.full(ci.size, -1, dtype=np.int64)])
    ev_ph = np.concatenate([np.full(xi.size, _PH_X), np.full(m.size, _PH_S), np.full(m.size, _PH_F),
                            np.full(ci.size, _PH_C)]).astype(np.int8)
    ev_idx = np.concatenate([xi, m, m, ci])
    order = np.lexsort((ev_key, ev_ts))

    # Per X event (ops, then tasks, then packets): pid, tid, the index of its name literal, its
    # category literal and three integer arguments; formatted a chunk at a time from plain lists.
    names_u, name_inv = np.unique(ops["name"].astype(str), return_inverse=True) if n_ops else (np.zeros(0, str), np.zeros(0, np.int64))
    labels = [json.dumps(str(n)) for n in names_u]
    cats = [json.dumps(n) for n in t.op_types] + ['"task"', '"packet"']
    x_pid = np.concatenate([op_rank + 1, t_die + 1])
    x_tid = np.concatenate([op_tid, task_tid]).astype(np.int64)
    x_label = name_inv.astype(np.int64)
    x_cat = ops["type"].astype(np.int64)
    x_a = [np.arange(n_ops), ops["node_id"], ops["bytes"]]
    if n_tasks:
        # Task names: the pipe and the op it works for ("CUBE o_proj_mb0"), one literal per pair.
        t_op = tasks["op"].astype(np.int64)
        pair = t_pipe * (len(names_u) + 1) + np.where(t_op >= 0, name_inv[np.maximum(t_op, 0)], len(names_u))
        pairs_u, pair_inv = np.unique(pair, return_inverse=True)
        for pr in pairs_u.tolist():
            pipe, nm = divmod(pr, len(names_u) + 1)
            labels.append(json.dumps(PIPE_NAMES[pipe] + (" " + str(names_u[nm]) if nm < len(names_u) else "")))
        x_label = np.concatenate([x_label, len(names_u) + pair_inv])
        x_cat = np.concatenate([x_cat, np.full(n_tasks, len(t.op_types))])
        x_a = [np.concatenate([x_a[0], t_pipe]), np.concatenate([x_a[1], t_op]),
               np.concatenate([x_a[2], tasks["bytes"]])]
    n_ot = n_ops + n_tasks  # X rows from here on are packets
    if n_pkt:
        # Packet names: the type and the op that moved it ("WRITE send_act"), like the tasks'.
        p_types = _enum_names(t.require("packets")["type"], PACKET_TYPE_NAMES)
        p_type = pk["type"].astype(np.int64)
        p_op = pk["op"].astype(np.int64)
        pair = p_type * (len(names_u) + 1) + np.where(p_op >= 0, name_inv[np.maximum(p_op, 0)], len(names_u))
        pairs_u, pair_inv = np.unique(pair, return_inverse=True)
        base = len(labels)
        for pr in pairs_u.tolist():
            ty, nm = divmod(pr, len(names_u) + 1)
            labels.append(json.dumps(p_types[ty] + (" " + str(names_u[nm]) if nm < len(names_u) else "")))
        x_pid = np.concatenate([x_pid, p_owner + 1])
        x_tid = np.concatenate([x_tid, pkt_tid.astype(np.int64)])
        x_label = np.concatenate([x_label, base + pair_inv])
        x_cat = np.concatenate([x_cat, np.full(n_pkt, len(t.op_types) + 1)])
        x_a = [np.concatenate([x_a[0], pk["msg"]]), np.concatenate([x_a[1], p_op]),
               np.concatenate([x_a[2], pk["seq"]])]
        type_lit = [json.dumps(n) for n in p_types]
        p_more = list(zip(p_link.tolist(), pk["wire_bytes"].tolist(), [type_lit[c] for c in p_type.tolist()]))
    pipe_lit = [json.dumps(n) for n in PIPE_NAMES]
    x_dur = x_end - x_ts
    f_row = np.concatenate([fl_src, fl_dst])  # flow e's start op: f_row[e], its end op: f_row[n_flows + e]
    n_flows = fl_src.size
    flow_tail = ['"name":"message","cat":"message"', '"name":"dispatch->combine","cat":"moe"']

    def chunk_lines(sel) -> list[str]:
        ph = ev_ph[sel]
        idx = ev_idx[sel]
        ts = _us(ev_ts[sel])
        lines = [""] * sel.size
        k = np.flatnonzero(ph == _PH_X)
        if k.size:
            i = idx[k]
            dur = _us(x_dur[i])
            for pos, ii, t_s, d_s, pid, tid, lab, cat, a0, a1, a2 in zip(
                    k.tolist(), i.tolist(), [ts[j] for j in k.tolist()], dur, x_pid[i].tolist(), x_tid[i].tolist(),
                    x_label[i].tolist(), x_cat[i].tolist(), x_a[0][i].tolist(), x_a[1][i].tolist(), x_a[2][i].tolist()):
                if ii < n_ops:
                    args = f'"op":{a0},"node_id":{a1},"bytes":{a2}'
                elif ii < n_ot:
                    args = f'"pipe":{pipe_lit[a0]},"op":{a1},"bytes":{a2}'
                else:
                    link, wire, ty = p_more[ii - n_ot]
                    args = f'"link":{link},"msg":{a0},"op":{a1},"seq":{a2},"wire_bytes":{wire},"type":{ty}'
                lines[pos] = (f'{{"ph":"X","pid":{pid},"tid":{tid},"ts":{t_s},"dur":{d_s},"name":{labels[lab]},'
                              f'"cat":{cats[cat]},"args":{{{args}}}}}')
        for phase, letter, tail, offset in ((_PH_S, "s", "", 0), (_PH_F, "f", ',"bp":"e"', n_flows)):
            k = np.flatnonzero(ph == phase)
            if k.size:
                rows = f_row[idx[k] + offset]
                for pos, fid, pid, tid, moe in zip(k.tolist(), idx[k].tolist(), (op_rank[rows] + 1).tolist(),
                                                   op_tid[rows].tolist(), fl_moe[idx[k]].tolist()):
                    lines[pos] = (f'{{"ph":"{letter}","id":{fid},"pid":{pid},"tid":{tid},"ts":{ts[pos]},'
                                  f'{flow_tail[moe]}{tail}}}')
        k = np.flatnonzero(ph == _PH_C)
        if k.size:
            i = idx[k]
            for pos, pid, name, v in zip(k.tolist(), (c_owner[i] + 1).tolist(), c_name[i].tolist(), c_val[i].tolist()):
                lines[pos] = (f'{{"ph":"C","pid":{pid},"name":{counter_names[name]},"ts":{ts[pos]},'
                              f'"args":{{"GB/s":{v:.6g}}}}}')
        return lines

    written = len(meta)
    with atomic_open(out, "wb", inputs=(t.path,)) as raw, _gzip_text(raw, out.name) as f:
        f.write('{"displayTimeUnit":"ns","otherData":')
        f.write(json.dumps({
            "generator": f"cmemu {t.attrs.get('cmemu_version', '?')}", "timeline": str(t.path),
            "preset": t.attrs.get("preset"), "sim_end_us": end_us, "time_unit": "us (ts and dur)",
            "window_us": None if win is None else [win[0] / 1e6, win[1] / 1e6],
            "tasks": t.tasks_status(), "link_counters": "GB/s per bin" if bins is not None else "not recorded",
            "hbm_counters": hbm_counters,
            "moe_flows": (f"{pairs['dispatch_op'].size} dispatch->combine pairs" if t.has_moe_pairs()
                          else f"not in layout version {t.version} (v4 records them)"),
            "packets": packets_note,
        }))
        f.write(',"traceEvents":[\n')
        f.write(",\n".join(json.dumps(e, separators=(",", ":")) for e in meta))
        sep = ",\n" if meta else ""
        for lo in range(0, order.size, _WRITE_ROWS):
            lines = chunk_lines(order[lo:lo + _WRITE_ROWS])
            if lines:
                f.write(sep)
                f.write(",\n".join(lines))
                sep = ",\n"
            written += len(lines)
        f.write("\n]}\n")
    return ExportInfo(out, written, written - len(meta), total, win, int(keep_op.sum()), int(keep_task.sum()),
                      int(m.size), int(ci.size), int(fl_moe[m].sum()), kept_pkt, packets_note)


@contextlib.contextmanager
def _gzip_text(raw, name: str):
    """Text into gzip (level 6) on the open binary file ``raw``; the header names ``name`` (what
    gunzip -N restores), not the temporary file. After an exception the stream is closed quietly,
    so that an error while flushing it (a full disk) does not hide the first one."""
    f = io.TextIOWrapper(gzip.GzipFile(filename=name, mode="wb", fileobj=raw, compresslevel=6), encoding="utf-8")
    try:
        yield f
    except BaseException:
        with contextlib.suppress(Exception):
            f.close()
        raise
    f.close()


def _counter_rows(key, b, nbytes, bin_ps):
    """Counter samples from sparse bins of one counter per key: a value at each bin's start and
    a 0 where a run of nonzero bins ends. Returns columns key, ts_ps, gbyte_per_s."""
    key = np.asarray(key, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    order = np.lexsort((b, key))
    key, b, nbytes = key[order], b[order], np.asarray(nbytes)[order]
    nxt_same = np.zeros(key.size, dtype=bool)
    if key.size > 1:
        nxt_same[:-1] = (key[1:] == key[:-1]) & (b[1:] == b[:-1] + 1)
    z = np.flatnonzero(~nxt_same)
    all_key = np.concatenate([key, key[z]])
    all_ts = np.concatenate([b * bin_ps, (b[z] + 1) * bin_ps])
    # bytes per ps * 1e12 = B/s; / 1e9 = GB/s
    gbs = np.concatenate([nbytes / bin_ps * 1e3, np.zeros(z.size)])
    o = np.lexsort((all_ts, all_key))
    return {"key": all_key[o], "ts_ps": all_ts[o], "gbyte_per_s": gbs[o]}


def _link_owner_and_names(links, vnames, dies_and_cpus: int, kinds):
    """Per link: the vertex whose process shows its counter, and the counter's name (JSON literal).
    A link into a die or CPU is shown on that endpoint (what it receives), any other on its source."""
    src, dst, kind = links["src_vertex"], links["dst_vertex"], links["kind"]
    into_ep = dst < dies_and_cpus
    owner = np.where(into_ep, dst, src).astype(np.int64)
    names = []
    for i in range(src.size):
        k = kinds[kind[i]]
        if into_ep[i]:
            names.append(json.dumps(f"link {i} {k} from {vnames[src[i]]}"))
        else:
            names.append(json.dumps(f"link {i} {k} to {vnames[dst[i]]}"))
    return owner, names
