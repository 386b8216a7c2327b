"""HBM shared by the running ops of a die (cmemu._core.hbm_sharing, docs/model.md "HBM shared").

Each COMP op demands its HBM bytes over the duration the die model gives it alone. While the
demands of a die's running ops add up to more than the die's HBM capacity, each runs at
capacity / total demand of its own speed; otherwise at full speed.
"""
import json
import math

import numpy as np
import pytest

from cmemu.run import run_trace

# A decode-sized INT8 GEMM: 16 tokens x 7168 -> 4096 reads 29 MB of weights for 0.9 GFLOP: it is
# bound by HBM. Twelve AICs each, so two fit on a die's 24 at once.
GEMM = {"cmemu.op": "gemm", "cmemu.m": 16, "cmemu.n": 4096, "cmemu.k": 7168, "cmemu.dtype": "int8",
        "cmemu.cores": 12}


def _run(tmp_path, nodes, native=True, name="t.json"):
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini", "nodes": nodes}
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return run_trace(path, progress=False, native=native)


def _gemm(i, rank, stream, **attrs):
    return {"id": i, "type": "COMP", "rank": rank, "stream": stream, "attrs": {**GEMM, **attrs}}


def _alone(tmp_path):
    r = _run(tmp_path, [_gemm(0, 0, 0)], name="alone.json")
    L = r.lowered
    dur = int(r.op_end_ps[0] - r.op_start_ps[0])
    assert dur == L.op_dur_ps[0]  # alone: exactly the die model's time
    return dur, int(L.op_hbm_bytes[0]), int(L.die_hbm_byte_per_s[0])


def test_two_memory_bound_ops_on_one_die_share_its_hbm(tmp_path):
    dur, nbytes, cap = _alone(tmp_path)
    demand = math.ceil(nbytes / dur * 1e12)
    assert 2 * demand > cap  # each alone draws more than half the die's HBM
    r = _run(tmp_path, [_gemm(0, 0, 0), _gemm(1, 0, 1)])
    assert r.op_start_ps[0] == r.op_start_ps[1] == 0
    # Both run at cap / (2 x demand) of their speed from start to end, so both end at
    # dur x 2 x demand / cap (to the picosecond the die's clock rounds to).
    expect = dur * 2 * demand / cap
    for i in (0, 1):
        assert r.op_end_ps[i] == pytest.approx(expect, abs=2)
    # Together they moved their bytes at the die's capacity, not above it.
    achieved = 2 * nbytes / (r.op_end_ps.max() * 1e-12)
    assert achieved == pytest.approx(cap, rel=1e-6)


def test_ops_on_different_dies_do_not_share(tmp_path):
    dur, _, _ = _alone(tmp_path)
    r = _run(tmp_path, [_gemm(0, 0, 0), _gemm(1, 1, 0)])
    assert list(r.op_end_ps) == [dur, dur]


def test_a_late_joiner_slows_the_running_op_only_while_they_overlap(tmp_path):
    dur, nbytes, cap = _alone(tmp_path)
    demand = math.ceil(nbytes / dur * 1e12)
    # Op 1 starts when op 0 is half done (after a timed wait on its stream).
    half_ns = dur / 2 / 1000
    wait = {"id": 1, "type": "COMP", "rank": 0, "stream": 2, "attrs": {"cmemu.duration_ns": half_ns}}
    r = _run(tmp_path, [_gemm(0, 0, 0), wait, {**_gemm(2, 0, 1), "data_deps": [1]}])
    t1 = int(r.op_start_ps[2])
    assert t1 == pytest.approx(dur / 2, abs=1)
    slow = cap / (2 * demand)  # the speed of each while both run
    # Op 0 has dur - t1 of its work left at t1, done at `slow` speed; then the joiner runs alone
    # for what it has left.
    end0 = t1 + (dur - t1) / slow
    assert r.op_end_ps[0] == pytest.approx(end0, abs=2)
    done = (end0 - t1) * slow
    assert r.op_end_ps[2] == pytest.approx(end0 + (dur - done), abs=3)


def test_ops_without_hbm_traffic_are_not_slowed(tmp_path):
    dur, _, _ = _alone(tmp_path)
    fixed = {"id": 1, "type": "COMP", "rank": 0, "stream": 1, "attrs": {"cmemu.duration_ns": 5000.0}}
    r = _run(tmp_path, [_gemm(0, 0, 0), fixed, _gemm(2, 0, 2)])
    assert r.op_end_ps[1] == 5_000_000
    assert r.op_end_ps[0] > dur  # the two GEMMs still share


@pytest.mark.parametrize("stagger_ns", [0.0, 1234.5])
def test_native_and_reference_share_alike(tmp_path, stagger_ns):
    nodes = [_gemm(0, 0, 0), {"id": 1, "type": "COMP", "rank": 0, "stream": 1,
                              "attrs": {"cmemu.duration_ns": stagger_ns or 1.0}},
             {**_gemm(2, 0, 1, **{"cmemu.cores": 6}), "data_deps": [1]},
             {**_gemm(3, 0, 0), "data_deps": [0]}, _gemm(4, 1, 0)]
    a = _run(tmp_path, nodes, native=True)
    b = _run(tmp_path, nodes, native=False, name="u.json")
    np.testing.assert_array_equal(a.op_start_ps, b.op_start_ps)
    np.testing.assert_array_equal(a.op_end_ps, b.op_end_ps)
    assert a.events == b.events


def test_a_kv_load_and_a_memory_bound_gemm_share_the_die(tmp_path):
    # A MEM_LOAD draws the die's whole read rate; beside the GEMM both slow down, the load's
    # access latency still ends it; and the binned HBM bytes never pass the capacity.
    dur, nbytes, cap = _alone(tmp_path)
    load = {"id": 1, "type": "MEM_LOAD", "rank": 0, "stream": 1, "attrs": {"tensor_size": 64_000_000}}
    alone = _run(tmp_path, [load | {"id": 0}], name="load.json")
    together = _run(tmp_path, [_gemm(0, 0, 0), load])
    assert together.op_end_ps[1] > alone.op_end_ps[0]
    assert together.op_end_ps[0] > dur
    s = together.hbm_series
    assert (s["bytes"] / (s["bin_ps"] * 1e-12)).max() <= cap * 1.001
    # Conservation: the bins hold every byte of both ops.
    assert int(s["bytes"].sum()) == nbytes + 64_000_000
