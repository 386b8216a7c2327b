"""Failed parts (from the start of a run): routes avoid them; what cannot run says why."""
import json

import numpy as np
import pytest

from cmemu.errors import CmemuError, SimulationError
from cmemu.fabric import build_fabric
from cmemu.faults import FaultError, parse_failures
from cmemu.run import run_trace
from cmemu.scenarios.ub_p2p import all_to_all
from cmemu.spec import load_system
from cmemu.topology import build_topology
from conftest import TRACES


@pytest.fixture(scope="module")
def topo():
    return build_topology(load_system("mini"))


def test_parse_names_the_links(topo):
    f = parse_failures(["l2:3.5"], topo)
    l2 = topo.num_endpoints + topo.spec.nodes * 7 + 3 * 16 + 5
    touching = np.flatnonzero((topo.link_src == l2) | (topo.link_dst == l2))
    # On mini each L2 chip has one uplink from each of the 2 nodes' L1 chips of its plane: 2 cables,
    # 4 directed links.
    assert f.links == frozenset(touching.tolist()) and len(touching) == 4
    assert parse_failures(["die:7"], topo).dies == {7}
    assert parse_failures(["link:12"], topo).links == {12}


@pytest.mark.parametrize("spec, words", [
    ("l2:7.0", "PLANE 0..6"), ("l1:2.0", "NODE 0..1"), ("die:32", "0..31"), ("link:99999", "links"),
    ("l2:1", "l2:N.N"), ("switch:1", "expected link:ID"),
])
def test_bad_specs(topo, spec, words):
    with pytest.raises(FaultError, match=words):
        parse_failures([spec], topo)


def _write(tmp_path, doc, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _pair_doc(src, dst, size, **header):
    return {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini", **header, "nodes": [
        {"id": 0, "type": "COMM_SEND", "rank": src, "attrs": {"comm_dst": dst, "comm_size": size}},
        {"id": 1, "type": "COMM_RECV", "rank": dst, "attrs": {"comm_src": src, "comm_size": size}}]}


def test_routes_avoid_a_failed_l2_chip(tmp_path, topo):
    path = _write(tmp_path, _pair_doc(0, 16, 2**20))
    healthy = run_trace(path, progress=False)
    failed = run_trace(path, progress=False, fail=["l2:2.4"])
    dead = sorted(parse_failures(["l2:2.4"], topo).links)
    assert healthy.link_bytes[dead].sum() > 0  # spraying used that chip ...
    assert failed.link_bytes[dead].sum() == 0  # ... and avoids it once it has failed
    assert failed.link_bytes.sum() == healthy.link_bytes.sum()  # the same packets, other paths


def test_native_and_reference_agree_with_failures(tmp_path):
    path = _write(tmp_path, _pair_doc(3, 20, 300_000))
    a = run_trace(path, progress=False, fail=["l2:0.0", "l1:1.3"], native=True)
    b = run_trace(path, progress=False, fail=["l2:0.0", "l1:1.3"], native=False)
    np.testing.assert_array_equal(a.op_end_ps, b.op_end_ps)
    np.testing.assert_array_equal(a.link_bytes, b.link_bytes)


def test_op_on_a_failed_die_is_an_error(tmp_path):
    with pytest.raises(SimulationError, match=r"node 1 .* needs die 16, which has failed"):
        run_trace(_write(tmp_path, _pair_doc(0, 16, 512)), progress=False, fail=["die:16"])


def test_no_path_left_is_an_error_naming_the_message(tmp_path):
    every_l1 = [f"l1:0.{p}" for p in range(7)]
    with pytest.raises(SimulationError, match=r"from die 0 to die 16 \(node 0 .*\) has no path left"):
        run_trace(_write(tmp_path, _pair_doc(0, 16, 512)), progress=False, fail=every_l1)


def test_fault_schedule_in_the_trace(tmp_path):
    doc = _pair_doc(0, 16, 2**20, **{"cmemu.faults": [{"fail": "l2:2.4"}]})
    r = run_trace(_write(tmp_path, doc), progress=False)
    topo = build_topology(load_system("mini"))
    assert r.link_bytes[sorted(parse_failures(["l2:2.4"], topo).links)].sum() == 0
    with pytest.raises(CmemuError, match="at_ns must be a time"):
        run_trace(_write(tmp_path, _pair_doc(0, 16, 512, **{"cmemu.faults": [{"fail": "l2:0.1", "at_ns": -5}]}),
                         "bad.json"), progress=False)


def test_a_chip_failing_mid_transfer_loses_packets_that_are_sent_again(tmp_path):
    # 8 MiB from die 0 to die 16 (2048 packets sprayed over all 112 paths); at 10 us, L2 chip
    # 0.0 fails: packets queued for it or on its links are lost and sent again after the
    # retransmission timeout, on other paths. Everything still arrives, later.
    size = 8 * 2**20
    healthy = run_trace(_write(tmp_path, _pair_doc(0, 16, size), "h.json"), progress=False)
    doc = _pair_doc(0, 16, size, **{"cmemu.faults": [{"fail": "l2:0.0", "at_ns": 10_000}]})
    failed = run_trace(_write(tmp_path, doc, "f.json"), progress=False)
    assert failed.packets_lost > 0
    rto = round(load_system("mini").ub.retransmit_timeout_ns * 1000)
    assert failed.op_end_ps[1] > healthy.op_end_ps[1] and failed.op_end_ps[1] >= 10_000_000 + rto
    assert int(failed.msg_delivered_ps[0]) == int(failed.op_end_ps[1])  # all of it arrived
    # The native kernel and the reference agree on all of it.
    ref = run_trace(_write(tmp_path, doc, "f.json"), progress=False, native=False)
    np.testing.assert_array_equal(ref.op_end_ps, failed.op_end_ps)
    assert ref.packets_lost == failed.packets_lost


def test_a_die_failing_during_the_run_fails_the_ops_that_need_it_later(tmp_path):
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini",
           "cmemu.faults": [{"fail": "die:3", "at_ns": 500}], "nodes": [
               {"id": 0, "type": "COMP", "rank": 3, "attrs": {"cmemu.duration_ns": 100}},
               {"id": 1, "name": "late", "type": "COMP", "rank": 3, "attrs": {"cmemu.duration_ns": 100}},
               {"id": 2, "type": "COMP", "rank": 3, "data_deps": [1], "attrs": {"cmemu.duration_ns": 1000}},
               {"id": 3, "name": "after", "type": "COMP", "rank": 3, "data_deps": [2],
                "attrs": {"cmemu.duration_ns": 10}}]}
    with pytest.raises(SimulationError, match=r"node 3 'after' .* needs die 3, which failed at 0.500 us"):
        run_trace(_write(tmp_path, doc), progress=False)


def test_all_to_all_degrades_with_failed_chips(topo):
    healthy = all_to_all(topo, build_fabric(topo), 32, 65536)
    some = all_to_all(topo, build_fabric(topo, parse_failures([f"l2:{j % 7}.{j // 7}" for j in range(16)], topo)),
                      32, 65536)
    l1 = all_to_all(topo, build_fabric(topo, parse_failures(["l1:0.0"], topo)), 32, 65536)
    key = "bandwidth_per_die_mean_gbyte_per_s"
    assert some[key] < healthy[key]
    # A node that lost one of its 7 L1 chips keeps 6/7 of its ports: its dies slow down most.
    assert l1["bandwidth_per_die_min_gbyte_per_s"] < 0.95 * healthy["bandwidth_per_die_min_gbyte_per_s"]
    assert l1[key] > 0.5 * healthy[key]


def test_cli_fail_option(cli, tmp_path):
    out = tmp_path / "o.h5"
    ok = cli("run", TRACES / "mini_moe_layer.json", "-o", out, "-q", "--fail", "l2:0.3")
    assert ok.returncode == 0 and out.exists()
    bad = cli("run", TRACES / "mini_moe_layer.json", "-o", tmp_path / "x.h5", "--fail", "l2:9.9", check=False)
    assert bad.returncode == 2 and "l2:9.9" in bad.stderr and not (tmp_path / "x.h5").exists()


def _uplink_of(topo, die, plane):
    from cmemu.topology import L_DIE_UP

    return int(np.flatnonzero((topo.link_kind == L_DIE_UP) & (topo.link_src == die))[plane])


def test_lost_traffic_spreads_over_the_live_planes(tmp_path, topo):
    # 8 MiB from die 0 to die 16 (another node) with one of die 0's 7 uplinks failed: the
    # packets that plane would have carried go evenly over the six others, within a packet per
    # plane, and the write takes what six ports give (7/6 of the healthy time, the path's latency
    # aside), not what two planes sharing the lost share would.
    size = 8 << 20
    path = _write(tmp_path, _pair_doc(0, 16, size))
    healthy = run_trace(path, progress=False)
    dead = _uplink_of(topo, 0, 4)
    failed = run_trace(path, progress=False, fail=[f"link:{dead}"])
    ups = [_uplink_of(topo, 0, p) for p in range(7)]
    wire = failed.link_bytes[ups]
    assert wire[4] == 0
    live = np.delete(wire, 4)
    packet = topo.spec.ub.flit_wire_byte(topo.spec.ub.transport_mtu_byte + topo.spec.ub.header_write_byte)
    assert live.max() - live.min() <= packet
    t_h = int(healthy.op_end_ps[1] - healthy.op_start_ps[0])
    t_f = int(failed.op_end_ps[1] - failed.op_start_ps[0])
    assert t_f == pytest.approx(t_h * 7 / 6, rel=0.03)


def test_all_to_all_with_a_dead_uplink_costs_its_share(tmp_path, topo):
    # A 32-die all-to-all loses one of 224 die ports: it may slow by about the lost port's share of
    # its busiest die, 1/6 (its other six ports carry its traffic), not by 63%.
    dead = _uplink_of(topo, 0, 2)
    healthy = all_to_all(topo, build_fabric(topo), 32, 256 << 10)["completion_us"]
    failed = all_to_all(topo, build_fabric(topo, parse_failures([f"link:{dead}"], topo)), 32, 256 << 10)["completion_us"]
    assert failed < healthy * 1.25


def test_a_failed_die_to_die_link_falls_back_to_ub(tmp_path, topo):
    # Dies 0 and 1 are one NPU's two dies: with their die-to-die link down, the message goes over
    # UB through the node's L1 chips (7 ports), as between any two dies of a node.
    from cmemu.topology import L_D2D

    d2d = [int(i) for i in np.flatnonzero((topo.link_kind == L_D2D) & (topo.link_src == 0))]
    path = _write(tmp_path, _pair_doc(0, 1, 1 << 20))
    failed = run_trace(path, progress=False, fail=[f"link:{d2d[0]}"])
    ub = run_trace(_write(tmp_path, _pair_doc(0, 2, 1 << 20), "ub.json"), progress=False)
    assert failed.link_bytes[d2d[0]] == 0
    assert int(failed.op_end_ps[1]) == int(ub.op_end_ps[1])  # the same path lengths as to die 2
    both = run_trace(path, progress=False, fail=[f"link:{d2d[0]}"], native=False)
    np.testing.assert_array_equal(failed.op_end_ps, both.op_end_ps)
