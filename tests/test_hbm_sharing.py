"""HBM shared by the running ops of a die (cmemu._core.hbm_sharing, docs/model.md "HBM shared").

Each op demands its HBM bytes over the duration the die model gives it alone (at most what its
cores can move). While the demands of a die's running ops add up to more than the die's HBM
capacity, the capacity is shared max-min: an op whose demand is under the level keeps its
speed, the others each get the level and run at level / demand of their speed.
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


# The same weights over 8 AICs (memory-bound, a little under the 12-core one's demand); half of
# them; and a compute-bound INT8 GEMM (2048^3: 17 GFLOP for 17 MB) that draws a tenth of the HBM.
HEAVY8 = {**GEMM, "cmemu.cores": 8}
HALF8 = {**GEMM, "cmemu.n": 2048, "cmemu.cores": 8}
COMPUTE = {"cmemu.op": "gemm", "cmemu.m": 2048, "cmemu.n": 2048, "cmemu.k": 2048, "cmemu.dtype": "int8",
           "cmemu.cores": 8}


def _run(tmp_path, nodes, native=True, name="t.json", **kw):
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini", "nodes": nodes}
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return run_trace(path, progress=False, native=native, **kw)


def _comp(i, stream, attrs, rank=0, **node):
    return {"id": i, "type": "COMP", "rank": rank, "stream": stream, "attrs": attrs, **node}


def _wait(i, stream, ns):
    """A timed op with no HBM traffic: what a later op waits for, to start at a given time."""
    return _comp(i, stream, {"cmemu.duration_ns": ns})


def _demand(r, i):
    """Op i's demand as the sharing takes it: its bytes over its alone time, rounded up."""
    L = r.lowered
    return math.ceil(int(L.op_hbm_bytes[i]) / int(L.op_dur_ps[i]) * 1e12)


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


def test_a_compute_bound_op_beside_a_memory_bound_one_is_not_slowed_while_the_total_fits(tmp_path):
    r = _run(tmp_path, [_gemm(0, 0, 0), _comp(1, 1, COMPUTE)])
    L, cap = r.lowered, int(r.lowered.die_hbm_byte_per_s[0])
    assert _demand(r, 1) < cap / 8 < cap / 2 < _demand(r, 0)  # one light, one heavy
    assert _demand(r, 0) + _demand(r, 1) <= cap
    assert list(r.op_start_ps) == [0, 0]
    assert list(r.op_end_ps) == list(L.op_dur_ps)  # both exactly as alone


def test_two_memory_bound_ops_split_the_capacity_evenly(tmp_path):
    # A (12 AICs) and B (8 AICs, half the weights) each demand more than half the capacity: each
    # gets half of it, so each runs at (cap / 2) / its demand of its speed (a proportional share
    # would have given both cap / (dA + dB)). B ends first; then A runs alone at full speed.
    r = _run(tmp_path, [_gemm(0, 0, 0), _comp(1, 1, HALF8)])
    L, cap = r.lowered, int(r.lowered.die_hbm_byte_per_s[0])
    da, db = _demand(r, 0), _demand(r, 1)
    dur_a, dur_b = int(L.op_dur_ps[0]), int(L.op_dur_ps[1])
    assert cap / 2 < db < da
    t_b = dur_b * db / (cap / 2)
    assert r.op_end_ps[1] == pytest.approx(t_b, abs=2)
    done_a = t_b * (cap / 2) / da  # A's alone time done by then
    assert r.op_end_ps[0] == pytest.approx(t_b + dur_a - done_a, abs=3)
    # While both ran, each moved its bytes at half the capacity.
    assert L.op_hbm_bytes[1] / (r.op_end_ps[1] * 1e-12) == pytest.approx(cap / 2, rel=1e-6)


def test_a_low_demand_op_keeps_its_speed_while_two_heavy_ones_split_the_rest(tmp_path):
    # 8 AICs each: the compute-bound GEMM's demand c is under its even share, so it gets all of
    # it; the two memory-bound ones split cap - c and run at ((cap - c) / 2) / d of their speed.
    # The compute-bound one outlasts them: it ends exactly as alone.
    nodes = [_comp(0, 0, COMPUTE), _comp(1, 1, HEAVY8), _comp(2, 2, HEAVY8)]
    r = _run(tmp_path, nodes, link_bin_ns=2000)
    L, cap = r.lowered, int(r.lowered.die_hbm_byte_per_s[0])
    c, d = _demand(r, 0), _demand(r, 1)
    assert 3 * c < cap < c + 2 * d
    level = (cap - c) / 2
    assert c < level < d
    assert r.op_end_ps[0] == L.op_dur_ps[0]
    heavy_end = int(L.op_dur_ps[1]) * d / level
    for i in (1, 2):
        assert r.op_end_ps[i] == pytest.approx(heavy_end, abs=2)
    assert r.op_end_ps[0] > heavy_end
    # The HBM series: the die's whole capacity while all three run (the light op's bytes at its
    # own rate, not at the heavy ones' slowed one); the light op's rate alone afterwards.
    s = r.hbm_series
    rate = s["bytes"] / (s["bin_ps"] * 1e-12)
    first, last = s["bin"] * s["bin_ps"], (s["bin"] + 1) * s["bin_ps"]
    together = last <= heavy_end
    after = (first >= heavy_end) & (last <= r.op_end_ps[0])
    assert together.sum() >= 10 and after.sum() >= 10
    np.testing.assert_allclose(rate[together], cap, rtol=1e-3)
    np.testing.assert_allclose(rate[after], int(L.op_hbm_bytes[0]) / (L.op_dur_ps[0] * 1e-12), rtol=1e-3)


def test_a_light_late_joiner_takes_only_its_demand(tmp_path):
    # A 64 MB load streams at the die's whole capacity alone. Half-way through, the compute-bound
    # GEMM starts: it keeps its full speed (its demand c is far under the level), and the load
    # gets the rest, cap - c: from then on it runs at (cap - c) / its demand of its speed. It ends
    # one access latency after its bytes are moved.
    load = {"id": 0, "type": "MEM_LOAD", "rank": 0, "stream": 0, "attrs": {"tensor_size": 64_000_000}}
    alone = _run(tmp_path, [load], name="load.json")
    dur_l, lat = int(alone.lowered.op_dur_ps[0]), int(alone.lowered.op_lat_ps[0])
    assert alone.op_end_ps[0] == dur_l + lat
    t1_ns = dur_l / 2 / 1000
    r = _run(tmp_path, [load, _wait(1, 1, t1_ns), _comp(2, 2, COMPUTE, data_deps=[1])])
    L, cap = r.lowered, int(r.lowered.die_hbm_byte_per_s[0])
    t1 = int(r.op_start_ps[2])
    assert t1 == pytest.approx(dur_l / 2, abs=1)
    dl, c = _demand(r, 0), _demand(r, 2)
    assert dl + c > cap and 2 * c < cap
    # Before t1 the load ran alone at full speed: dur_l - t1 of its alone time is left.
    moved = t1 + (dur_l - t1) * dl / (cap - c)
    assert r.op_end_ps[0] == pytest.approx(moved + lat, abs=2)
    assert r.op_end_ps[2] == t1 + L.op_dur_ps[2]  # the joiner, as alone
    assert r.op_end_ps[2] > moved


def test_a_demand_is_at_most_what_the_ops_cores_can_move(tmp_path):
    # Twenty times an op's bytes in its alone time would be more than its cores' MTE2 and FixPipe
    # (an AIC) or MTE2 and MTE3 (an AIV) can move: its demand is what they move.
    from cmemu._core import hbm_sharing
    from cmemu.spec import load_system

    die = load_system("mini").die
    hz = die.ai_core_clock_mhz * 1e6
    aic_move = int((die.mte2_byte_per_cycle + die.fixpipe_byte_per_cycle) * hz)
    aiv_move = int((die.aiv_mte2_byte_per_cycle + die.mte3_byte_per_cycle) * hz)
    nodes = [_comp(0, 0, {**GEMM, "cmemu.cores": 1}),
             _comp(1, 1, {"cmemu.op": "rmsnorm", "cmemu.rows": 64, "cmemu.cols": 7168, "cmemu.cores": 4}),
             _comp(2, 2, {"cmemu.op": "mla_decode", "cmemu.tokens": 16, "cmemu.kv_len": 1024, "cmemu.cores": 1}),
             {"id": 3, "type": "MEM_LOAD", "rank": 0, "stream": 3, "attrs": {"tensor_size": 1_000_000}}]
    L = _run(tmp_path, nodes).lowered
    cap = int(L.die_hbm_byte_per_s[0])
    assert list(L.op_aic) == [1, 0, 1, 0] and list(L.op_aiv) == [0, 4, 2, 0]
    most = [aic_move, 4 * aiv_move, aic_move + 2 * aiv_move]
    _, rate = hbm_sharing(L)
    for i in range(3):
        assert rate[i] == math.ceil(L.op_hbm_bytes[i] / L.op_dur_ps[i] * 1e12) < most[i]  # as timed: under the cap
    L.op_hbm_bytes[:] *= 20
    _, rate = hbm_sharing(L)
    for i in range(3):
        assert L.op_hbm_bytes[i] / L.op_dur_ps[i] * 1e12 > most[i] and most[i] < cap
        assert rate[i] == most[i]
    # A MEM op has no cores: only its die's capacity bounds it.
    assert rate[3] == cap


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
    _assert_alike(_run(tmp_path, nodes, native=True), _run(tmp_path, nodes, native=False, name="u.json"))


def _assert_alike(a, b):
    np.testing.assert_array_equal(a.op_start_ps, b.op_start_ps)
    np.testing.assert_array_equal(a.op_end_ps, b.op_end_ps)
    assert a.events == b.events
    for k in a.hbm_clock:
        np.testing.assert_array_equal(a.hbm_clock[k], b.hbm_clock[k])
    for k in ("die", "bin", "bytes"):
        np.testing.assert_array_equal(a.hbm_series[k], b.hbm_series[k])


# Ops of every demand: memory-bound GEMMs on 1 to 12 AICs, compute-bound ones, a vector op on
# AIVs, an attention on clusters, loads and stores.
_SHAPES = [{**GEMM, "cmemu.cores": c} for c in (1, 3, 8, 12)] + [
    {**COMPUTE, "cmemu.cores": c} for c in (2, 8)] + [
    {"cmemu.op": "rmsnorm", "cmemu.rows": 64, "cmemu.cols": 7168, "cmemu.cores": 8},
    {"cmemu.op": "mla_decode", "cmemu.tokens": 16, "cmemu.kv_len": 1024, "cmemu.cores": 4},
    ("MEM_LOAD", 16_000_000), ("MEM_LOAD", 3_000_000), ("MEM_STORE", 8_000_000)]


def _random_mix(rng):
    """A few streams on two dies, each a chain of random ops, some behind a timed wait so that
    they join their die's share at odd times."""
    nodes = []
    for stream in range(int(rng.integers(2, 6))):
        rank = int(rng.integers(0, 2))
        for _ in range(int(rng.integers(1, 4))):
            i = len(nodes)
            if rng.random() < 0.4:
                nodes.append(_wait(i, stream, float(rng.integers(1, 40_000)) + 0.5) | {"rank": rank})
                continue
            shape = _SHAPES[int(rng.integers(0, len(_SHAPES)))]
            if isinstance(shape, tuple):
                nodes.append({"id": i, "type": shape[0], "rank": rank, "stream": stream,
                              "attrs": {"tensor_size": shape[1]}})
            else:
                nodes.append(_comp(i, stream, shape, rank=rank))
    return nodes


def test_native_and_reference_share_alike_on_random_mixes(tmp_path):
    # The two engines agree on every time, the share records and the HBM series; in some of
    # the mixes ops are capped (a level shared by one op or more).
    rng = np.random.default_rng(17)
    capped = 0
    for _ in range(8):
        nodes = _random_mix(rng)
        a = _run(tmp_path, nodes, native=True, link_bin_ns=5000)
        _assert_alike(a, _run(tmp_path, nodes, native=False, name="u.json", link_bin_ns=5000))
        capped += int((a.hbm_clock["sharers"] > 0).any())
    assert capped >= 2


def test_hours_oversubscribed_native_and_reference_agree(tmp_path):
    # Three streams of 15-minute loads (alone) on one die, four each, the second and third
    # streams starting 5 and 10 minutes late: from then on at least two loads run at every
    # moment, all capped, for hours, long enough for the native engine's share clock (1/1024 ps
    # units) to pass 2**61 and start again from 0 (the reference's Python ints never need to).
    nbytes = 1_340_000_000_000_000
    nodes = [_wait(0, 1, 3e11), _wait(1, 2, 6e11)]
    for stream in range(3):
        for k in range(4):
            i = len(nodes)
            deps = {"data_deps": [stream - 1]} if stream and k == 0 else {}
            nodes.append({"id": i, "type": "MEM_LOAD", "rank": 0, "stream": stream,
                          "attrs": {"tensor_size": nbytes}, **deps})
    a = _run(tmp_path, nodes, native=True, link_bin_ns=0)
    b = _run(tmp_path, nodes, native=False, name="u.json", link_bin_ns=0)
    np.testing.assert_array_equal(a.op_start_ps, b.op_start_ps)
    np.testing.assert_array_equal(a.op_end_ps, b.op_end_ps)
    for key in a.hbm_clock:
        np.testing.assert_array_equal(a.hbm_clock[key], b.hbm_clock[key])
    # The share clock's advance over the longest stretch with ops capped (it restarts at a
    # record with none).
    c, cap = a.hbm_clock, int(a.lowered.die_hbm_byte_per_s[0])
    k = best = 0
    for i in range(len(c["t_ps"]) - 1):
        if c["sharers"][i] == 0:
            k = 0
            continue
        dt = int(c["t_ps"][i + 1] - c["t_ps"][i])
        k += dt * 1024 * int(c["shared_byte_per_s"][i]) // (int(c["sharers"][i]) * cap)
        best = max(best, k)
    assert best > 2**61
    # The die's HBM was busy at its capacity throughout (one load alone draws it all too).
    assert a.op_end_ps.max() == pytest.approx(12 * nbytes / cap * 1e12, rel=1e-6)


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
