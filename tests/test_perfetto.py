"""`cmemu export perfetto`: the Chrome trace-event JSON is checked for the structure a viewer
needs, without a viewer: it parses, every complete event has pid/tid/ts/dur, events of one
thread nest properly, flows pair up (s before f, same id, each bound inside its op's slice),
timestamps are sorted, every process and thread is named, and times convert exactly from ps."""
import dataclasses
import gzip
import json
from collections import defaultdict

import numpy as np
import pytest

from cmemu.output import hdf5
from cmemu.output.perfetto import ExportError, assign_lanes, export_perfetto, parse_window
from cmemu.output.reader import Timeline, open_timeline
from cmemu.run import run_trace
from conftest import TRACES
from test_timeline import TINY, with_records


def ps(us: float) -> int:
    return round(us * 1e6)


def load(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def validate(doc) -> dict:
    """Assert the structure; return the events grouped by phase."""
    assert doc["displayTimeUnit"] == "ns"
    events = doc["traceEvents"]
    by = defaultdict(list)
    for e in events:
        by[e["ph"]].append(e)
    assert set(by) <= {"M", "X", "s", "f", "C"}
    # Metadata first, then timed events in timestamp order.
    phases = [e["ph"] for e in events]
    n_meta = len(by["M"])
    assert all(p == "M" for p in phases[:n_meta])
    ts = [e["ts"] for e in events[n_meta:]]
    assert ts == sorted(ts)
    # Names for every process and thread that holds events.
    procs = {e["pid"] for e in by["M"] if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]) for e in by["M"] if e["name"] == "thread_name"}
    assert all(e["args"]["name"] for e in by["M"] if e["name"] in ("process_name", "thread_name"))
    for e in by["X"] + by["s"] + by["f"]:
        assert e["pid"] in procs and (e["pid"], e["tid"]) in threads
    for e in by["C"]:
        assert e["pid"] in procs and e["args"] and all(v >= 0 for v in e["args"].values())
    # Complete events: fields, and proper nesting per thread (sequential or contained).
    per_thread = defaultdict(list)
    for i, e in enumerate(by["X"]):
        for k in ("pid", "tid", "ts", "dur", "name"):
            assert k in e, (k, e)
        assert e["dur"] >= 0
        per_thread[(e["pid"], e["tid"])].append((ps(e["ts"]), ps(e["ts"] + e["dur"]), i))
    for key, spans in per_thread.items():
        stack = []
        for s, t, i in sorted(spans, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or t <= stack[-1], f"partial overlap on thread {key}"
            stack.append(t)
    # Flows: one s and one f per id, s first in the file, f not earlier, each inside a slice of its thread.
    order = {id(e): i for i, e in enumerate(events)}
    starts = {e["id"]: e for e in by["s"]}
    ends = {e["id"]: e for e in by["f"]}
    assert len(starts) == len(by["s"]) and len(ends) == len(by["f"]) and starts.keys() == ends.keys()
    for fid, s in starts.items():
        f = ends[fid]
        assert order[id(s)] < order[id(f)] and f["ts"] >= s["ts"] and f.get("bp") == "e"
        for ev in (s, f):
            t = ps(ev["ts"])
            assert any(a <= t <= b for a, b, _ in per_thread[(ev["pid"], ev["tid"])]), ev
    # Counters sorted per track.
    tracks = defaultdict(list)
    for e in by["C"]:
        tracks[(e["pid"], e["name"])].append(e["ts"])
    assert all(v == sorted(v) for v in tracks.values())
    return by


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    path = tmp_path_factory.mktemp("pf") / "layer.h5"
    run_trace(TRACES / "mini_moe_layer.json", output=path, progress=False)
    return path


@pytest.fixture(scope="module")
def tiny_h5(tmp_path_factory):
    r = run_trace(TINY, progress=False)
    path = tmp_path_factory.mktemp("pf") / "tiny.h5"
    hdf5.write_timeline(path, with_records(dataclasses.replace(r, tasks=None, link_series=None)))
    return path


def test_shipped_trace_structure(shipped, tmp_path):
    out = tmp_path / "t.json.gz"
    info = export_perfetto(shipped, out)
    by = validate(load(out))
    with open_timeline(shipped) as t:
        ops, msgs = t.ops(), t.messages()
        binned = t.link_bins()
        tasks = t.tasks()
    # One complete event per op, and one per pipe task (the die model's pipe summaries of its ops).
    assert info.op_events == len(ops) and info.task_events == len(tasks) > 0
    assert len(by["X"]) == len(ops) + len(tasks)
    assert len(by["s"]) == len(msgs) == info.flows
    names = [e["args"]["name"] for e in by["M"] if e["name"] == "process_name"]
    assert "node 0 / NPU 0 / die 0" in names and "node 1 / NPU 7 / die 1" in names
    # Die processes come first, in die order, so sorted by node.
    sort = {e["pid"]: e["args"]["sort_index"] for e in by["M"] if e["name"] == "process_sort_index"}
    die_pids = sorted({e["pid"] for e in by["X"]})
    assert [sort[p] for p in die_pids] == sorted(sort[p] for p in die_pids)
    threads = {e["args"]["name"] for e in by["M"] if e["name"] == "thread_name"}
    assert {"stream 0", "stream 1"} <= threads and "CUBE" in threads
    if binned is not None:
        assert len(by["C"]) == info.counter_events > 0


def test_times_convert_exactly_from_ps(tiny_h5, tmp_path):
    out = tmp_path / "t.json.gz"
    export_perfetto(tiny_h5, out)
    raw = gzip.open(out, "rt").read()
    by = validate(json.loads(raw))
    with open_timeline(tiny_h5) as t:
        ops = t.ops()
    x = {e["args"]["op"]: e for e in by["X"] if e.get("cat") != "task"}
    for i in range(len(ops)):
        assert ps(x[i]["ts"]) == ops["start_ps"][i] and ps(x[i]["dur"]) == ops["dur_ps"][i]
        assert x[i]["name"] == ops["name"][i] and x[i]["cat"] == ops["type"][i]
    # Written as exact decimal microseconds: send_x starts at 1,000,000 ps (after a 1000 ns op).
    assert f'"ts":1.000000,"dur":{ops["dur_ps"][1] // 10**6}.{ops["dur_ps"][1] % 10**6:06d},"name":"send_x"' in raw


def test_tasks_get_pipe_threads_and_lanes(tiny_h5, tmp_path):
    """Two CUBE tasks run at once for every COMP op: they go to "CUBE" and "CUBE #2"."""
    out = tmp_path / "t.json.gz"
    info = export_perfetto(tiny_h5, out)
    by = validate(load(out))
    tnames = {(e["pid"], e["args"]["name"]) for e in by["M"] if e["name"] == "thread_name"}
    assert (1, "CUBE") in tnames and (1, "CUBE #2") in tnames and (1, "MTE2") in tnames
    assert (1, "SDMA") in tnames and (1, "stream 0") in tnames
    tasks = [e for e in by["X"] if e["cat"] == "task"]
    assert len(tasks) == info.task_events > 0
    assert any(e["name"] == "CUBE prologue" for e in tasks)
    # Stream threads sort before pipe threads within a die.
    sort = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in by["M"] if e["name"] == "thread_sort_index"}
    tid = {(e["pid"], e["args"]["name"]): e["tid"] for e in by["M"] if e["name"] == "thread_name"}
    assert sort[(1, tid[(1, "stream 0")])] < sort[(1, tid[(1, "CUBE")])]


def test_link_counters_from_binned(tiny_h5, tmp_path):
    out = tmp_path / "t.json.gz"
    export_perfetto(tiny_h5, out)
    by = validate(load(out))
    with open_timeline(tiny_h5) as t:
        bins, bin_ps = t.link_bins(), t.link_bin_ps
    counters = by["C"]
    assert counters
    # Every nonzero bin gives one sample of bytes / bin width in GB/s.
    for link, b, nbytes in zip(bins["link"][:20], bins["bin"][:20], bins["bytes"][:20]):
        hits = [e for e in counters if e["name"].startswith(f"link {link} ") and ps(e["ts"]) == b * bin_ps]
        assert len(hits) == 1
        assert hits[0]["args"]["GB/s"] == pytest.approx(nbytes / bin_ps * 1e3, rel=1e-5)
    # A run of nonzero bins ends with a zero sample.
    last = defaultdict(float)
    for e in counters:
        last[(e["pid"], e["name"])] = e["args"]["GB/s"]
    assert all(v == 0 for v in last.values())


def test_size_limit_refuses_or_keeps_a_window(shipped, tmp_path, cli):
    out = tmp_path / "t.json.gz"
    with pytest.raises(ExportError, match="--window"):
        export_perfetto(shipped, out, max_events=3000)
    assert not out.exists()
    proc = cli("export", "perfetto", shipped, "-o", out, "--max-events", "3000", check=False)
    assert proc.returncode == 2 and "--window" in proc.stderr and not out.exists()
    proc = cli("export", "perfetto", shipped, "-o", out, "--max-events", "3000", "--window", "140:160")
    assert "kept" in proc.stdout and "window 140.000 to 160.000 us" in proc.stdout
    by = validate(load(out))
    assert all(e["ts"] <= 160 and e["ts"] + e["dur"] >= 140 for e in by["X"])
    assert 0 < len(by["X"]) < 2432
    # A window after the end of the run: a valid, empty trace, and the command says so.
    proc = cli("export", "perfetto", shipped, "-o", out, "--window", "100000:100001")
    assert "kept 0 of" in proc.stdout and load(out)["traceEvents"] == []


def test_v1_timeline_exports(tmp_path):
    from test_timeline import TINY_V1

    out = tmp_path / "v1.json.gz"
    info = export_perfetto(TINY_V1, out)
    by = validate(load(out))
    assert len(by["X"]) == info.op_events == 12 and len(by["s"]) == 3 and not by["C"]


def test_window_syntax():
    assert parse_window("1.5:2") == (1_500_000, 2_000_000)
    for bad in ("5", "2:1", "a:b", "-1:3"):
        with pytest.raises(ExportError, match="--window"):
            parse_window(bad)


def test_assign_lanes_partitions_overlaps_only_where_needed():
    track = np.array([0, 0, 0, 1, 1, 0])
    start = np.array([0, 5, 10, 0, 10, 12])
    end = np.array([10, 8, 20, 10, 20, 15])
    lanes = assign_lanes(track, start, end)
    assert lanes.tolist() == [0, 1, 0, 0, 0, 1]
    # No track overlaps: all lane 0, whatever the order.
    assert assign_lanes(np.array([3, 3]), np.array([5, 0]), np.array([9, 5])).tolist() == [0, 0]


@pytest.fixture(scope="module")
def decode_h5(tmp_path_factory):
    path = tmp_path_factory.mktemp("pf") / "decode.h5"
    run_trace(TRACES / "deepseek_r1_decode_mini_2layers.json", output=path, progress=False)
    return path


def test_dispatch_to_combine_flows_and_hbm_counters(decode_h5, tmp_path):
    """v4: one arrow per rank and MoE exchange, from the dispatch to the combine of the same
    layer and micro-batch on that rank; HBM counters per die and per stack beside the links'."""
    out = tmp_path / "d.json.gz"
    info = export_perfetto(decode_h5, out)
    doc = load(out)
    by = validate(doc)  # paired ids, sorted timestamps, each end bound inside a slice of its thread
    with open_timeline(decode_h5) as t:
        pairs = t.moe_pairs()
        ops = t.ops()
        stacks = t.hbm_stacks
        hbm = t.hbm_bins()
    moe_s = [e for e in by["s"] if e["cat"] == "moe"]
    moe_f = {e["id"]: e for e in by["f"] if e["cat"] == "moe"}
    assert len(moe_s) == len(moe_f) == len(pairs) == info.moe_flows == 128  # 32 ranks x 2 layers x 2 mb
    names = np.asarray(ops["name"])
    x_at = {(e["pid"], e["tid"], ps(e["ts"])): e["name"] for e in by["X"] if e["cat"] == "COMM_COLL"}
    for s in moe_s:
        f = moe_f[s["id"]]
        assert s["pid"] == f["pid"] and f["ts"] >= s["ts"]
        assert x_at[(s["pid"], s["tid"], ps(s["ts"]))].endswith(".dispatch")
    for d, c in zip(pairs["dispatch_op"], pairs["combine_op"]):
        assert names[d].removesuffix("dispatch") == names[c].removesuffix("combine")
    assert "128 dispatch->combine" in doc["otherData"]["moe_flows"]
    # Counters: the die's HBM and each of its stacks, GB/s from the bins.
    c = [e for e in by["C"] if e["pid"] == 1]
    got = {e["name"] for e in c}
    assert {"HBM GB/s"} | {f"HBM stack {k} GB/s" for k in range(stacks)} <= got
    assert any(n.startswith("link ") for n in got)
    bin_ps = int(hbm["start_ps"][1] // hbm["bin"][1]) if hbm["bin"][1] else None
    first = [e for e in c if e["name"] == "HBM GB/s"][0]
    row = [i for i in range(len(hbm)) if hbm["die"][i] == 0][0]
    assert first["args"]["GB/s"] == pytest.approx(float(hbm["gbyte_per_s"][row]), rel=1e-5)
    assert bin_ps is None or ps(first["ts"]) == hbm["bin"][row] * bin_ps
    per_stack = [e for e in c if e["name"].startswith("HBM stack") and e["ts"] == first["ts"]]
    assert sum(e["args"]["GB/s"] for e in per_stack) == pytest.approx(first["args"]["GB/s"], rel=1e-5)


@pytest.fixture(scope="module")
def packets_h5(tmp_path_factory):
    path = tmp_path_factory.mktemp("pf") / "pingpong.h5"
    run_trace(TRACES / "examples" / "pingpong.json", output=path, progress=False, detail="packets")
    return path


def test_packets_on_a_thread_per_link(packets_h5, tmp_path):
    """--detail packets: an X event per /packets row, on a thread per link named by its ends, in
    the process that shows the link's counter; a link sends one packet at a time, so its thread
    holds them in order without overlap."""
    out = tmp_path / "p.json.gz"
    info = export_perfetto(packets_h5, out)
    doc = load(out)
    by = validate(doc)
    with Timeline(packets_h5, as_numpy=True) as t:  # numpy either way: pandas is optional
        pk, links, vnames, ops = t.packets(), t.links(), t.vertex_names(), t.ops()
    assert len(pk) > 1 and np.unique(pk["link"]).size > 1
    # The premise, checked on the file rather than assumed: per link, each packet starts after
    # the previous one's tail has left.
    for link in np.unique(pk["link"]):
        rows = pk[pk["link"] == link]
        s, e = rows["start_ps"], rows["end_ps"]
        assert (np.diff(s) >= 0).all() and (s[1:] >= e[:-1]).all()
    x = [e for e in by["X"] if e["cat"] == "packet"]
    assert len(x) == len(pk) == info.packet_events
    assert len(by["X"]) == info.op_events + info.task_events + len(pk)
    # Arguments and exact times, row for row (msg, op, seq identify a row on a link).
    got = {(e["args"]["link"], e["args"]["msg"], e["args"]["op"], e["args"]["seq"]): e for e in x}
    assert len(got) == len(pk)
    names = np.asarray(ops["name"])
    for r in pk:
        e = got[(int(r["link"]), int(r["msg"]), int(r["op"]), int(r["seq"]))]
        assert ps(e["ts"]) == r["start_ps"] and ps(e["dur"]) == r["dur_ps"]
        assert e["args"]["wire_bytes"] == r["wire_bytes"] and e["args"]["type"] == r["type"]
        assert e["name"] == f"{r['type']} {names[r['op']]}"
    # One thread per link, named by the link's ends, in the process of the link's counter.
    tname = {(e["pid"], e["tid"]): e["args"]["name"] for e in by["M"] if e["name"] == "thread_name"}
    thread_of_link = defaultdict(set)
    for e in x:
        thread_of_link[e["args"]["link"]].add((e["pid"], e["tid"]))
    assert set(thread_of_link) == set(pk["link"].tolist())
    counter_pid = {e["name"].split()[1]: e["pid"] for e in by["C"] if e["name"].startswith("link ")}
    for link, threads in thread_of_link.items():
        assert len(threads) == 1
        (pid, tid), = threads
        src, dst = vnames[links["src_vertex"][link]], vnames[links["dst_vertex"][link]]
        assert tname[(pid, tid)] == f"link {link} {links['kind'][link]}: {src} -> {dst}"
        assert pid == counter_pid[str(link)]
        # Sorted, and no two packets of the link overlap on its thread.
        spans = [(ps(e["ts"]), ps(e["ts"] + e["dur"])) for e in x if (e["pid"], e["tid"]) == (pid, tid)]
        assert spans == sorted(spans)
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))
    # Link threads sort after the die's streams and pipes.
    sort = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in by["M"] if e["name"] == "thread_sort_index"}
    for (pid, tid), name in tname.items():
        if not name.startswith("link "):
            assert all(sort[(pid, tid)] < sort[k] for k in tname if k[0] == pid and tname[k].startswith("link "))
    assert doc["otherData"]["packets"].startswith(f"{len(pk)} transmissions on {len(thread_of_link)} links")


def test_packets_count_in_the_event_budget(packets_h5, tmp_path):
    """Packets that alone pass --max-events are left out with a warning (otherData says so);
    a window keeps those that overlap it; the rest of the trace is as without them."""
    out = tmp_path / "p.json.gz"
    full = export_perfetto(packets_h5, out)
    base = full.timed_events - full.packet_events
    assert full.timed_events_total == full.timed_events
    with pytest.warns(UserWarning, match="packets left out"):
        info = export_perfetto(packets_h5, out, max_events=base + 10)
    doc = load(out)
    by = validate(doc)
    assert info.packet_events == 0 and not [e for e in by["X"] if e["cat"] == "packet"]
    assert info.timed_events == base and "--window" in doc["otherData"]["packets"]
    assert not any(e["args"]["name"].startswith("link ") for e in by["M"] if e["name"] == "thread_name")
    # A window over the first packets: those overlapping it are kept, counted in the budget.
    with open_timeline(packets_h5) as t:
        pk = t.columns("packets")
    lo, hi = int(pk["start_ps"][0]), int(pk["end_ps"][3])
    info = export_perfetto(packets_h5, out, window=f"{lo / 1e6}:{hi / 1e6}")
    doc = load(out)
    by = validate(doc)
    x = [e for e in by["X"] if e["cat"] == "packet"]
    want = int(((pk["end_ps"] >= lo) & (pk["start_ps"] <= hi)).sum())
    assert len(x) == info.packet_events == want >= 4
    assert doc["otherData"]["packets"].startswith(f"{want} of {pk['link'].size} transmissions")
    # Not even the rest fits: refused as before, with the packets in the count.
    with pytest.raises(ExportError, match=f"{full.timed_events_total:,} events"):
        export_perfetto(packets_h5, out, max_events=base - 1)


def test_without_packets_nothing_changes(tiny_h5, tmp_path):
    """A timeline without /packets: no packet events or link threads; otherData says why."""
    out = tmp_path / "t.json.gz"
    info = export_perfetto(tiny_h5, out)
    doc = load(out)
    by = validate(doc)
    assert info.packet_events == 0 and len(by["X"]) == info.op_events + info.task_events
    assert not any(e["args"]["name"].startswith("link ") for e in by["M"] if e["name"] == "thread_name")
    assert "--detail packets" in doc["otherData"]["packets"]
