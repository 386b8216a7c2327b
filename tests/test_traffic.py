"""The traffic scenario: its generator (offered load, destinations, determinism) and its curves
(accepted = offered below saturation, the incast saturation point by hand)."""
import numpy as np
import pytest
from click.testing import CliRunner

from cmemu.cli import main
from cmemu.scenarios import run_scenario
from cmemu.scenarios.traffic import Traffic, generate

MINI_DIES, DIES_PER_NPU = 32, 2
RATE = 28e9  # one UB port, B/s
WIRE = 580  # 512 B + the 52 B write header, in 20 B flits


def _traffic(pattern="uniform", arrival="bernoulli", load=0.5, window_us=2000.0, seed=3, senders=8):
    return Traffic(pattern, arrival, load, 512, WIRE, RATE, 0, round(window_us * 1e6), seed, senders)


@pytest.mark.parametrize("arrival", ["bernoulli", "poisson"])
@pytest.mark.parametrize("load", [0.1, 0.5, 0.9])
def test_offered_load_within_one_percent_over_a_long_window(arrival, load):
    t = _traffic(arrival=arrival, load=load)
    src, _dst, created, senders = generate(t, MINI_DIES, DIES_PER_NPU)
    offered = src.size * WIRE / (senders * t.window_ps * 1e-12 * RATE)
    assert abs(offered / load - 1) <= 0.01
    assert created.min() >= 0 and created.max() < t.window_ps
    for s in range(senders):  # each sender's own share too (69,000 packet times each)
        mine = np.count_nonzero(src == s) * WIRE / (t.window_ps * 1e-12 * RATE)
        assert abs(mine / load - 1) <= 0.05


def test_destinations_by_pattern():
    twin = np.arange(MINI_DIES) ^ 1
    for pattern in ("uniform", "permutation", "all-to-all", "incast"):
        src, dst, created, senders = generate(_traffic(pattern, window_us=50), MINI_DIES, DIES_PER_NPU)
        assert np.all(dst != src) and np.all(dst != twin[src]), pattern
        if pattern == "uniform":  # every other die but the twin is reached, about as often
            counts = np.bincount(dst[src == 5], minlength=MINI_DIES)
            assert np.count_nonzero(counts) == MINI_DIES - 2
        if pattern == "permutation":  # one partner per die, each die the partner of one
            partner = {int(s): set(dst[src == s].tolist()) for s in np.unique(src)}
            assert all(len(p) == 1 for p in partner.values())
            assert sorted(p.pop() for p in partner.values()) == list(range(MINI_DIES))
        if pattern == "all-to-all":  # die 5: 6, 7, 8, ... 31, 0, 1, 2, 3 (not 4, its twin), again
            first = dst[src == 5][:MINI_DIES - 2].tolist()
            assert first == [*range(6, MINI_DIES), 0, 1, 2, 3]
        if pattern == "incast":
            assert senders == 8 and set(dst.tolist()) == {0} and len(set(src.tolist())) == 8
    a = generate(_traffic(window_us=20), MINI_DIES, DIES_PER_NPU)
    b = generate(_traffic(window_us=20), MINI_DIES, DIES_PER_NPU)
    c = generate(_traffic(window_us=20, seed=4), MINI_DIES, DIES_PER_NPU)
    assert all(np.array_equal(x, y) for x, y in zip(a[:3], b[:3]))
    assert not np.array_equal(a[2], c[2])


def test_accepted_equals_offered_below_saturation():
    params, tables = run_scenario("traffic", "mini", loads="0.2,0.5,0.8", fabric="both", window_us=20.0)
    rows = tables["latency-load"]
    assert len(rows) == 6
    for r in rows:
        assert not r["saturated"], r
        assert abs(r["accepted_load_percent"] / r["offered_load_percent"] - 1) <= 0.02, r
        assert abs(r["offered_load_percent"] / r["requested_load_percent"] - 1) <= 0.03, r
    for model in ("packet", "message"):
        lat = [r["mean_latency_ns"] for r in rows if r["fabric"] == model]
        assert lat == sorted(lat)  # queues grow with the load
    # The two fabric models see the same packets (the same seed).
    assert [r["packets"] for r in rows[:3]] == [r["packets"] for r in rows[3:]]
    # Deterministic: the same rows again.
    _, again = run_scenario("traffic", "mini", loads="0.2,0.5,0.8", fabric="both", window_us=20.0)
    assert again["latency-load"] == rows


def test_incast_saturates_at_the_receivers_port():
    """8 dies into die 0's one port (one sub-plane): the port takes 1/8 of each sender's rate."""
    params, tables = run_scenario("traffic", "mini", pattern="incast", loads="0.05,0.5",
                                  fabric="packet,message,message-bp")
    assert [r["fabric"] for r in tables["latency-load"]] == ["packet"] * 2 + ["message"] * 2 + ["message-bp"] * 2
    for model in ("packet", "message", "message-bp"):
        low, high = [r for r in tables["latency-load"] if r["fabric"] == model]
        assert not low["saturated"] and high["saturated"]
        assert abs(high["accepted_load_percent"] - 100 / 8) <= 0.3
        assert high["mean_latency_ns"] > 5 * low["mean_latency_ns"]
        assert params[f"{model}_first_saturated_load_percent"] == 50.0


def test_whole_fabric_has_seven_times_the_line_rate():
    params, tables = run_scenario("traffic", "mini", loads="0.3", scope="ub", window_us=5.0)
    assert params["line_rate_gbyte_per_s"] == 7 * 28.0
    (row,) = tables["latency-load"]
    assert abs(row["accepted_load_percent"] / row["offered_load_percent"] - 1) <= 0.03


def test_bad_options_are_one_line():
    runner = CliRunner()
    for args, text in ((["--packet-size", "8K"], "more than the transport MTU"), (["--load", "0,1"], "in (0, 1]"),
                       (["--load", "x"], "fractions of the line rate"), (["--dies", "64"], "has 32"),
                       (["--pattern", "incast", "--incast-senders", "31"], "--incast-senders must be 1 to 30"),
                       (["--fabric", "packet,fluid"], "'fluid' is not one of packet, message, message-bp or both")):
        res = runner.invoke(main, ["scenario", "run", "traffic", "-s", "mini", *args])
        assert res.exit_code == 2 and text in res.output, (args, res.output)


def test_plot(tmp_path):
    params, _ = run_scenario("traffic", "mini", loads="0.2,0.6", fabric="both", window_us=3.0,
                             plots=str(tmp_path / "p"))
    png = tmp_path / "p" / "traffic_uniform_sub-plane.png"
    assert params["plot"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"
