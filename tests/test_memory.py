"""The memory bound of `cmemu run --max-memory` (docs/model.md, "Memory"): sizes as written,
an estimate that stays above what a run really allocates, early refusal with one line, and the
event queue's check between engine slices."""
from __future__ import annotations

import json
import os
import random
import tracemalloc

import numpy as np
import pytest
from click.testing import CliRunner

import cmemu.run as R
import cmemu.run.pipeline
import cmemu.units as U
from cmemu.cli import main
from cmemu.errors import CmemuError
from cmemu.fabric import build_fabric
from cmemu.lower import lower
from cmemu.output.hdf5 import write_timeline
from cmemu.spec import load_system
from cmemu.topology import build_topology
from cmemu.trace import load_trace, read_trace

HEADER = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini"}


@pytest.mark.parametrize("text, expected", [
    ("2GB", 2 * 10**9), ("512MiB", 512 * 2**20), ("1.5 GiB", 3 * 2**29), ("1000000", 10**6),
    ("64kB", 64_000), ("3TB", 3 * 10**12), ("7B", 7), ("1KiB", 1024),
])
def test_memory_sizes(text, expected):
    assert U.parse_memory_size(text) == expected


@pytest.mark.parametrize("text", ["2Gb", "512 mib", "lots", "-1GB", "inf", "nan GB", "", "1.5.2GB", "GB"])
def test_bad_memory_sizes(text):
    with pytest.raises(ValueError):
        U.parse_memory_size(text)


def test_default_limit_is_a_fraction_of_physical_memory():
    import os

    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < U.default_memory_limit() <= physical * 3 // 4


def _comp_doc(n):
    rnd = random.Random(1)
    nodes = [{"id": i, "name": f"op_{i}", "type": "COMP", "rank": i % 32, "stream": i % 4,
              "data_deps": [rnd.randrange(i)] if i else [], "attrs": {"num_ops": 1e9, "tensor_size": 1000}}
             for i in range(n)]
    return {**HEADER, "nodes": nodes}


def _msg_doc(n, size):
    nodes = []
    for k in range(n):
        a = k % 32
        b = (a + 1 + k % 31) % 32
        nodes.append({"id": 2 * k, "type": "COMM_SEND", "rank": a,
                      "attrs": {"comm_dst": b, "comm_size": size, "comm_tag": k}})
        nodes.append({"id": 2 * k + 1, "type": "COMM_RECV", "rank": b, "stream": 1,
                      "attrs": {"comm_src": a, "comm_size": size, "comm_tag": k}})
    return {**HEADER, "nodes": nodes}


@pytest.mark.parametrize("doc, native", [
    (_comp_doc(20_000), True),
    (_msg_doc(10_000, 512), True),
    (_msg_doc(500, 256 * 1024), True),
    (_msg_doc(200, 64 * 1024), False),
], ids=["comp", "small-messages", "big-messages", "reference"])
def test_estimate_bounds_what_a_run_allocates(tmp_path, doc, native):
    # Peak of Python and numpy allocations from lowering to the written timeline, plus the native
    # event queue (malloc'd in C, so not traced): below the estimate, and not far below it.
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    topo = build_topology(load_system("mini"))
    # Modules the lowering imports on first use (the die model, Numba) are the baseline's, not
    # the run's: load them before measuring.
    (tmp_path / "warm.json").write_text(json.dumps(_comp_doc(2)))
    lower(load_trace(tmp_path / "warm.json", num_ranks=32), topo)
    trace = load_trace(path, num_ranks=32)
    need = R.estimate_memory(trace, topo, native=native)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        L = lower(trace, topo)
        F = build_fabric(topo)
        engine = R.simulate(L, F, native=native, bin_ps=10_000_000)
        result = R.RunResult(
            spec=topo.spec, topology=topo, trace=trace, lowered=L,
            op_start_ps=np.asarray(engine.op_start_ps), op_end_ps=np.asarray(engine.op_end_ps),
            link_bytes=np.asarray(engine.link_bytes), link_busy_ps=np.asarray(engine.link_busy_ps),
            events=int(engine.events), max_pending_events=int(engine.max_pending), wall_time_s=0.0,
            native=native, link_series=engine.link_series(),
            msg_packets=np.asarray(engine.msg_packets, dtype=np.int64),
            msg_delivered_ps=np.asarray(engine.msg_delivered_ps), packets_sent=int(engine.packets_sent))
        if L.pipe_task_op.size:  # as run_trace: the COMP ops' pipe intervals, then the user's view
            result.pipe_tasks, result.pipe_intervals = R.pipe_interval_tasks(result)
        write_timeline(tmp_path / "t.h5", R.trace_result(result))
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    if native:
        peak += 2 * engine.max_pending * R.EVENT_BYTES
    estimate = need.arrays_bytes + need.event_queue_bytes
    assert peak <= estimate <= 6 * peak, (peak, estimate)
    # The trace itself: measured after the parsed document is dropped.
    tracemalloc.start()
    try:
        read = read_trace(path)
        held = load_trace(path, num_ranks=32, read=read)
        del read
        trace_bytes = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(held.nodes) == need.ops
    assert trace_bytes <= need.trace_bytes <= 3 * trace_bytes


def test_run_refused_early_with_one_line(tmp_path):
    # Every die of cloudmatrix384 sends 1 MiB to the next: few nodes, many packets in flight.
    nodes = []
    for a in range(768):
        b = (a + 2) % 768
        nodes.append({"id": 2 * a, "type": "COMM_SEND", "rank": a, "attrs": {"comm_dst": b, "comm_size": 2**20}})
        nodes.append({"id": 2 * a + 1, "type": "COMM_RECV", "rank": b, "attrs": {"comm_src": a, "comm_size": 2**20}})
    path = tmp_path / "t.json"
    path.write_text(json.dumps({**HEADER, "system": "cloudmatrix384", "nodes": nodes}))
    topo = build_topology(load_system("cloudmatrix384"))
    # What a run checks: the estimate of its trace, with the binned series it must hold at the least.
    need = R.prepare_run(path).need.total_bytes
    assert need > R.estimate_memory(load_trace(path, num_ranks=768), topo).total_bytes
    to_read = R.BASELINE_BYTES + R.PARSE_BYTES_PER_FILE_BYTE * path.stat().st_size
    limit = (need + to_read) // 2
    assert to_read < limit < need  # the file can be read; the run does not fit
    out = tmp_path / "out.h5"
    result = CliRunner().invoke(main, ["run", str(path), "-o", str(out), "--max-memory", str(limit)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cmemu: error: ")
    for words in ("1,536 ops", "768 messages", "196,608 packets", "event queue",
                  f"memory limit of {U.format_bytes(limit)}", "--max-memory"):
        assert words in lines[0], lines[0]
    assert not out.exists() and not list(tmp_path.glob(".*tmp*"))
    ok = CliRunner().invoke(main, ["run", str(path), "-o", str(out), "--max-memory", str(need), "--quiet"])
    assert ok.exit_code == 0 and out.is_file()


def test_big_file_refused_before_it_is_read(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_comp_doc(50_000)))
    result = CliRunner().invoke(main, ["run", str(path), "--max-memory", "250MB", "-o", str(tmp_path / "o.h5")])
    assert result.exit_code == 2
    assert "reading this" in result.stderr and "trace needs about" in result.stderr


@pytest.mark.parametrize("native", [True, False])
def test_event_queue_checked_between_slices(tmp_path, monkeypatch, native):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_msg_doc(200, 64 * 1024)))
    topo = build_topology(load_system("mini"))
    L = lower(load_trace(path, num_ranks=32), topo)
    monkeypatch.setattr(cmemu.run.pipeline, "EVENTS_PER_SLICE", 50)
    with pytest.raises(R.MemoryLimitError, match=r"the event queue grew to [\d,]+ pending events") as err:
        R.simulate(L, build_fabric(topo), native=native, queue_limit_bytes=1000)
    assert isinstance(err.value, CmemuError)
    R.simulate(L, build_fabric(topo), native=native, queue_limit_bytes=10**9)  # enough: it ends


def test_bad_max_memory_option_exit_2(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_comp_doc(3)))
    result = CliRunner().invoke(main, ["run", str(path), "--max-memory", "2Gb"])
    assert result.exit_code == 2 and "'b' means bits" in result.output


def test_estimate_bounds_a_collective_heavy_run(tmp_path):
    # The EP320 decode step cut to 3 layers: almost all its ops and messages are the MoE
    # collectives' own (INNER_*). A child runs a two-op trace (imports, Numba's caches loaded),
    # resets its high-water mark (/proc/self/clear_refs) and runs the step: its peak resident
    # memory above where it started is below the estimate, and not far below it. A first run
    # fills Numba's disk cache.
    import subprocess
    import sys

    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak")
    trace = tmp_path / "ep320_3.json"
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps({**HEADER, "system": "cloudmatrix384", "nodes": _comp_doc(2)["nodes"]}))
    subprocess.run([sys.executable, "-c", "from cmemu.cli import main; main()", "trace", "gen", "deepseek-r1",
                    "--system", "cloudmatrix384", "--layers", "3", "-o", str(trace)], check=True, capture_output=True,
                   cwd=tmp_path)
    code = f"""
import gc
from cmemu.run import run_trace

def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))

run_trace({str(tiny)!r}, fabric_model="message", progress=False, output={str(tmp_path / "tiny.h5")!r})
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS:")
run_trace({str(trace)!r}, fabric_model="message", progress=False, output={str(tmp_path / "t.h5")!r})
print("peak", status("VmHWM:") - base)
"""
    # From tmp_path: `python -c` puts the working directory first on sys.path, and a checkout's
    # cmemu has no compiled core unless it was built in place.
    for _ in range(2):  # the first fills Numba's cache
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    peak = int(out.split("peak")[-1])
    topo = build_topology(load_system("cloudmatrix384"))
    need = R.estimate_memory(load_trace(trace, num_ranks=topo.spec.dies), topo)
    run_part = need.total_bytes - R.BASELINE_BYTES
    assert peak <= run_part <= 5 * peak, (peak, run_part)


def test_small_pages_restores_numpy_setting():
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:
        pytest.skip("numpy without the switch")
    before = _set_madvise_hugepage(True)
    try:
        with R.small_pages():
            assert _set_madvise_hugepage(False) is False  # off inside
        assert _set_madvise_hugepage(True) is True  # as it was after
    finally:
        _set_madvise_hugepage(before)
