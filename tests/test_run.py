"""End-to-end replays: timings computed by hand, dependency and stream order, blocked runs,
determinism, and the `cmemu run` command line."""
import json
import math

import h5py
import numpy as np
import pytest

from cmemu.errors import SimulationError, TraceError
from cmemu.fabric import build_fabric
from cmemu.run import run_trace
from cmemu.spec import load_system
from cmemu.topology import build_topology
from conftest import TRACES

# Hand computations from the preset's values (cloudmatrix384 design; sources in
# cmemu/spec/presets/cloudmatrix384.toml): 28 GB/s UB links, 20 B flits, 52 B write header,
# 28 B ack header, wire and switch latency per hop, the initiator's start-up and issue time,
# HBM write latency 203 cycles at 1.8 GHz.
_UB = load_system("mini").ub
UB = 28_000_000_000
WIRE = round(_UB.link_latency_ns * 1000)
SWITCH = round(_UB.switch_latency_ns * 1000)
STARTUP = round(_UB.initiator_startup_ns * 1000)
ISSUE_WRITE = round(_UB.write_issue_ns * 1000)
HBM_WRITE = round(203 * 1e6 / 1800)


def ser(nbytes, rate=UB):
    return math.ceil(nbytes * 1e12 / rate)


def write_wire(payload):
    return math.ceil((payload + 52) / 20) * 20


ACK = ser(40)  # a 28 B ack is two 20 B flits


def write_trace(tmp_path, nodes, name="t.json", system="mini"):
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": system, "nodes": nodes}
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def send(i, rank, dst, size, stream=0, tag=0, **kw):
    return {"id": i, "type": "COMM_SEND", "rank": rank, "stream": stream,
            "attrs": {"comm_dst": dst, "comm_size": size, "comm_tag": tag, **kw}}


def recv(i, rank, src, size, stream=0, tag=0, **kw):
    return {"id": i, "type": "COMM_RECV", "rank": rank, "stream": stream,
            "attrs": {"comm_src": src, "comm_size": size, "comm_tag": tag, **kw}}


def comp(i, rank, ns, stream=0, deps=()):
    return {"id": i, "type": "COMP", "rank": rank, "stream": stream, "data_deps": list(deps),
            "attrs": {"cmemu.duration_ns": ns}}


def times(result):
    return {int(n): (int(s), int(e)) for n, s, e in
            zip(result.lowered.op_node_id, result.op_start_ps, result.op_end_ps)}


def test_send_recv_intra_node_by_hand(tmp_path):
    # Die 0 -> die 2 (same node, different NPU): die -> L1 -> die, one 512 B write packet.
    t = times(run_trace(write_trace(tmp_path, [send(0, 0, 2, 512), recv(1, 2, 0, 512)]), progress=False))
    s = ser(write_wire(512))  # 580 B on the wire
    arrive = STARTUP + s + WIRE + s + WIRE + SWITCH
    assert t[1] == (0, arrive + HBM_WRITE)  # the receive ends when the data is in HBM
    # The send ends when the ack is back: it crosses the same two links the other way.
    assert t[0] == (0, arrive + HBM_WRITE + (ACK + WIRE) + (ACK + WIRE + SWITCH))


def test_send_recv_inter_node_by_hand(tmp_path):
    # Die 0 (node 0) -> die 16 (node 1): die -> L1 -> L2 -> L1 -> die, three switch traversals.
    t = times(run_trace(write_trace(tmp_path, [send(0, 0, 16, 512), recv(1, 16, 0, 512)]), progress=False))
    s = ser(write_wire(512))
    arrive = STARTUP + 4 * s + 4 * WIRE + 3 * SWITCH
    assert t[1][1] == arrive + HBM_WRITE
    assert t[0][1] == arrive + HBM_WRITE + 4 * (ACK + WIRE) + 3 * SWITCH


def test_send_recv_die_to_die_by_hand(tmp_path):
    # Die 0 -> die 1, its twin: the 270 GB/s die-to-die link with 100 ns latency (preset).
    t = times(run_trace(write_trace(tmp_path, [send(0, 0, 1, 512), recv(1, 1, 0, 512)]), progress=False))
    d2d = 270_000_000_000
    assert t[1][1] == STARTUP + ser(write_wire(512), d2d) + 100_000 + HBM_WRITE


def test_multi_packet_message_sprays_over_planes(tmp_path):
    # 14 packets of 4 KiB, one issued every 3.737 ns, sprayed over the 7 sub-planes: two per
    # plane. On the plane of packets 6 and 13, packet 13 waits for 6 to leave the die, then
    # (store and forward) crosses the L1 chip after it has fully arrived.
    size = 14 * 4096
    r = run_trace(write_trace(tmp_path, [send(0, 0, 2, size), recv(1, 2, 0, size)]), progress=False)
    t = times(r)
    s = ser(write_wire(4096))
    last = STARTUP + 6 * ISSUE_WRITE + 3 * s + 2 * WIRE + SWITCH
    assert t[1][1] == last + HBM_WRITE
    die_up = r.topology.ep_up[0]
    np.testing.assert_array_equal(r.link_bytes[die_up], [2 * write_wire(4096)] * 7)
    assert r.link_bytes.sum() == 2 * 14 * write_wire(4096)  # two links per packet
    assert r.packets_sent == 28 and int(r.msg_packets[0]) == 14


def test_receive_posted_late_ends_at_once(tmp_path):
    # The message is delivered long before the receive's dependency ends: the receive takes 0.
    nodes = [send(0, 0, 2, 512), comp(1, 2, 5_000), recv(2, 2, 0, 512)]
    t = times(run_trace(write_trace(tmp_path, nodes), progress=False))
    assert t[2] == (5_000_000, 5_000_000)


def test_stream_order_and_dependencies(tmp_path):
    nodes = [
        comp(0, 0, 100),                    # rank 0 stream 0
        comp(1, 0, 50),                     # same stream: after node 0
        comp(2, 0, 30, stream=1),           # other stream: concurrent with node 0
        comp(3, 5, 10, deps=[1, 2]),        # another rank, after both
        {"id": 4, "type": "COMP", "rank": 5, "stream": 1, "ctrl_deps": [0],
         "attrs": {"cmemu.duration_ns": 1}},
    ]
    t = times(run_trace(write_trace(tmp_path, nodes), progress=False))
    assert t[0] == (0, 100_000)
    assert t[1] == (100_000, 150_000)
    assert t[2] == (0, 30_000)
    assert t[3] == (150_000, 160_000)
    assert t[4] == (100_000, 101_000)


def test_hbm_accesses_share_their_die(tmp_path):
    # 1.6 MB at the HBM model's achieved streaming rate (at most the 1.6384 TB/s of the pins, at
    # least that less refresh, tRFC/tREFI = 350/3900: cmemu/die/hbm.py), then the read latency
    # 347 cycles at 1.8 GHz = 192.778 ns. Two loads at once on one die each draw the die's whole
    # read rate, so they share it: each runs at half speed.
    from cmemu.lower.memory import hbm_service_ps

    die = load_system("mini").die
    load = {"type": "MEM_LOAD", "rank": 3, "attrs": {"tensor_size": 1_600_000}}
    nodes = [{"id": 0, **load}, {"id": 1, "stream": 1, **load},
             {"id": 2, "type": "MEM_STORE", "rank": 4, "attrs": {"tensor_size": 1_600_000}}]
    t = times(run_trace(write_trace(tmp_path, nodes), progress=False))
    lat = round(347 * 1e6 / 1800)
    rd, wr = hbm_service_ps(1_600_000, die), hbm_service_ps(1_600_000, die, store=True)
    pin_ps = 1_600_000 / 1638.4e9 * 1e12
    assert pin_ps < rd < pin_ps / (1 - 350 / 3900) * 1.01
    assert t[0] == (0, 2 * rd + lat)
    assert t[1] == (0, 2 * rd + lat)  # both at half speed on the same HBM
    assert t[2] == (0, wr + round(203 * 1e6 / 1800))  # another die: no wait


def test_die_model_compute(tmp_path):
    # A generic COMP (num_ops, no shape): 1e12 bf16 flops on all 24 AIC at 353.89 TFLOPS take
    # the roofline time plus at most a few hundred cycles of start-up; on 12 AIC twice as long.
    nodes = [
        {"id": 0, "type": "COMP", "rank": 0, "attrs": {"num_ops": 1e12}},
        {"id": 1, "type": "COMP", "rank": 1, "attrs": {"num_ops": 1e12, "cmemu.cores": 12}},
        {"id": 2, "type": "COMP", "rank": 2, "attrs": {"num_ops": 1e3, "tensor_size": 16_000_000}},
    ]
    t = times(run_trace(write_trace(tmp_path, nodes), progress=False))
    peak = 24 * 4096 * 2 * 1.8e9
    roof = 1e12 / peak * 1e12
    assert roof <= t[0][1] <= roof + 1000 * 556  # + 1000 cycles
    assert t[1][1] == pytest.approx(2 * t[0][1], rel=1e-3)
    # memory-bound: 16 MB through the HBM model: slower than the pins, by refresh plus the
    # first chunk's latency and start-up (under 1 us) at most
    pin_ps = 16e6 / 1638.4e9 * 1e12
    assert pin_ps < t[2][1] < pin_ps / (1 - 350 / 3900) + 1_000_000


def test_send_recv_deadlock_is_caught_before_the_run(tmp_path):
    # Each rank waits to receive before it sends: a cycle through the messages, found statically.
    nodes = [recv(0, 0, 1, 64), send(1, 0, 1, 64), recv(2, 1, 0, 64), send(3, 1, 0, 64)]
    with pytest.raises(TraceError, match=r"node 0: .*dependency cycle: 0 -> 3 -> 2 -> 1 -> 0"):
        run_trace(write_trace(tmp_path, nodes), progress=False)


@pytest.mark.parametrize("native", [True, False])
def test_engine_names_blocked_ops_instead_of_hanging(native):
    # Lowered arrays that bypass validation: the only send depends on its own receive.
    from cmemu.lower import lowered_from_parts as _lowered
    from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND
    from cmemu.lower.comm import MessageTable
    from cmemu.run import simulate

    topo = build_topology(load_system("mini"))
    table = MessageTable()
    table.add(topo, 0, 2, 64, "ub", send_op=0, recv_op=1)
    L = _lowered([OP_KIND_SEND, OP_KIND_RECV], [0, 0], [1], [0], table, op_msg=[0, 0], rank=[0, 2])
    with pytest.raises(SimulationError) as err:
        simulate(L, build_fabric(topo), native=native)
    msg = str(err.value)
    assert "2 of 2 ops are blocked" in msg
    assert "node 1 'op1' (COMM_RECV, rank 2, stream 0) waits for its message from node 0" in msg
    assert "which never started" in msg


def test_rdma_plane(tmp_path):
    nodes = [send(0, 0, 20, 512, **{"cmemu.plane": "rdma"}), recv(1, 20, 0, 512, **{"cmemu.plane": "rdma"})]
    t = times(run_trace(write_trace(tmp_path, nodes), progress=False))
    s = ser(512 + 58, 25_000_000_000)  # 200 Gb/s, RoCEv2 framing of 58 B (preset)
    assert t[1][1] == STARTUP + 2 * s + 500_000 + (500_000 + 600_000) + HBM_WRITE


def _datasets(path):
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def test_determinism_identical_datasets(tmp_path):
    trace = TRACES / "mini_moe_layer.json"
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    run_trace(trace, output=a, progress=False)
    run_trace(trace, output=b, progress=False)
    da, db = _datasets(a), _datasets(b)
    assert da.keys() == db.keys() and len(da) >= 15
    for k in da:
        np.testing.assert_array_equal(da[k], db[k], err_msg=k)


def test_timeline_written_while_the_hbm_series_are_made(tmp_path):
    """run_trace writes the file's other groups while the HBM series are worked out
    (write_timeline's hbm_later): the same file as the whole result written at once, and the
    result it returns is whole."""
    import dataclasses

    from cmemu.output.hdf5 import write_timeline

    trace = TRACES / "mini_moe_layer.json"
    run = run_trace(trace, output=tmp_path / "run.h5", progress=False)
    assert run.hbm_series is not None and run.hbm_stack_series is not None and run.wall_time_s > 0
    write_timeline(tmp_path / "whole.h5", run)
    calls = []
    lacking = dataclasses.replace(run, hbm_series=None, hbm_stack_series=None, wall_time_s=-1.0)
    write_timeline(tmp_path / "later.h5", lacking, hbm_later=lambda: calls.append(1) or run)
    assert calls == [1]
    files = {name: _datasets(tmp_path / f"{name}.h5") for name in ("run", "whole", "later")}
    assert "dies/hbm_binned/bytes" in files["run"] and "dies/hbm_stack_binned/bytes" in files["run"]
    for name in ("whole", "later"):
        assert files[name].keys() == files["run"].keys()
        for k in files["run"]:
            np.testing.assert_array_equal(files[name][k], files["run"][k], err_msg=f"{name}: {k}")
    with h5py.File(tmp_path / "later.h5") as f:
        assert f.attrs["wall_time_s"] == run.wall_time_s  # the whole result's, not the first one's


def test_native_and_reference_give_the_same_timeline(tmp_path):
    nodes = [comp(0, 0, 10), send(1, 0, 17, 20_000), recv(2, 17, 0, 20_000), send(3, 5, 17, 9000, tag=1),
             recv(4, 17, 5, 9000, tag=1, stream=1), comp(5, 17, 3, deps=[2, 4])]
    path = write_trace(tmp_path, nodes)
    a = run_trace(path, progress=False, native=True)
    b = run_trace(path, progress=False, native=False)
    np.testing.assert_array_equal(a.op_start_ps, b.op_start_ps)
    np.testing.assert_array_equal(a.op_end_ps, b.op_end_ps)
    np.testing.assert_array_equal(a.link_busy_ps, b.link_busy_ps)
    assert a.events == b.events


def test_cli_run_writes_timeline_and_summary(cli, tmp_path):
    out = tmp_path / "layer.h5"
    proc = cli("run", TRACES / "mini_moe_layer.json", "-o", out)
    assert "simulated time" in proc.stdout and " us" in proc.stdout
    assert "wall time" in proc.stdout and "events" in proc.stdout
    assert "s with the timeline written" in proc.stdout  # the whole run, the HDF5 write included
    with h5py.File(out) as f:
        assert f.attrs["format"] == "cmemu.timeline" and f.attrs["version"] >= 1
        assert f.attrs["preset"] == "mini"
        assert json.loads(f.attrs["spec_json"])["nodes"] == 2
        n = f["ops/start_ps"].shape[0]
        assert n == len(json.loads((TRACES / "mini_moe_layer.json").read_text())["nodes"])
        assert np.all(f["ops/end_ps"][:] >= f["ops/start_ps"][:])
        assert f.attrs["sim_end_ps"] == f["ops/end_ps"][:].max()
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_cli_default_output_name(cli, tmp_path):
    path = write_trace(tmp_path, [comp(0, 0, 1)], name="tiny.json")
    cli("run", path, "--quiet", cwd=tmp_path)
    assert (tmp_path / "tiny.h5").is_file()


@pytest.mark.parametrize(
    "nodes, words",
    [
        ([{"id": 0, "type": "FLY", "rank": 0}], ["node 0", "type"]),
        ([comp(0, 999, 1)], ["node 0", "rank"]),
        ([recv(0, 1, 0, 64)], ["node 0", "comm_src"]),
        ([recv(0, 0, 1, 64), send(1, 0, 1, 64), recv(2, 1, 0, 64), send(3, 1, 0, 64)], ["node 0", "cycle"]),
    ],
)
def test_cli_bad_input_exit_2_one_line_no_output(cli, tmp_path, nodes, words):
    path = write_trace(tmp_path, nodes)
    out = tmp_path / "out.h5"
    proc = cli("run", path, "-o", out, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cmemu: error: ")
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0]
    assert not out.exists() and not list(tmp_path.glob("*.h5*")) and not list(tmp_path.glob(".*tmp*"))


def test_cli_bad_override_exit_2(cli, tmp_path):
    proc = cli("run", TRACES / "mini_moe_layer.json", "--set", "ub.warp_speed=9", "-o", tmp_path / "o.h5", check=False)
    assert proc.returncode == 2 and "ub.warp_speed" in proc.stderr
    assert not (tmp_path / "o.h5").exists()


def test_cli_missing_trace_exit_2(cli, tmp_path):
    proc = cli("run", tmp_path / "nope.json", check=False)
    assert proc.returncode == 2 and "nope.json" in proc.stderr


def test_a_trace_without_nodes_runs(tmp_path):
    # A JSONL trace cut after its header has no nodes: an empty run, not a crash in the lowering.
    path = tmp_path / "empty.jsonl"
    path.write_text(json.dumps({"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini"}) + "\n")
    r = run_trace(path, progress=False, output=tmp_path / "e.h5")
    assert r.sim_end_ps == 0 and r.lowered.num_ops == 0


def test_clock_range_sums_the_bytes_in_floats(tmp_path):
    """check_clock_range refuses a run whose worst case passes the engine's clock; its byte sum
    is in floats, which a sum in int64 would wrap (1,024 messages of 2**53 B sum to 2**63)."""
    import dataclasses

    from cmemu.lower import lower
    from cmemu.run import check_clock_range
    from cmemu.trace import load_trace

    nodes = [n for i in range(1024) for n in (send(2 * i, 0, 17, 1000, tag=i), recv(2 * i + 1, 17, 0, 1000, tag=i))]
    mini = build_topology(load_system("mini"))
    lowered = lower(load_trace(write_trace(tmp_path, nodes), mini.num_dies), mini)
    check_clock_range(lowered, build_fabric(mini))  # 1 MB: far from it
    huge = dataclasses.replace(lowered, msg_bytes=np.full(lowered.num_messages, 2**53, dtype=np.int64))
    assert huge.msg_bytes.sum() < 0 and huge.bytes_sum(np.float64) == 2.0**63
    with pytest.raises(SimulationError, match="days of simulated time"):
        check_clock_range(huge, build_fabric(mini))


def test_cmemu_warnings_are_one_line_for_the_user(capsys):
    """A warning of cmemu's own reaches the user as one line, without Python's source line;
    another package's keeps Python's form."""
    from cmemu.cli import _show_warning

    _show_warning(UserWarning("/tasks keeps at most 2 per op and pipe"), UserWarning,
                  "/site-packages/cmemu/results/view.py", 72)
    assert capsys.readouterr().err == "cmemu: warning: /tasks keeps at most 2 per op and pipe\n"
    _show_warning(DeprecationWarning("old"), DeprecationWarning, "/site-packages/h5py/x.py", 3)
    assert capsys.readouterr().err.startswith("/site-packages/h5py/x.py:3: DeprecationWarning: old")
