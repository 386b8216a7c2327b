"""`cmemu run --detail packets`: /packets round trip (rows per link sum to /links, every message's
packets are there, collectives' internal messages point at their collective), the reader with and
without pandas, the size warning and the refusal, and no /packets in a default run."""
import io
import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import cmemu.run as R
import cmemu.run.memory
from cmemu.errors import CmemuError
from cmemu.kernels import COMPILE_NOTICE
from cmemu.output.reader import Timeline, TimelineError, open_timeline
from cmemu.vocab import PACKET_TYPE_NAMES

REPO = Path(__file__).resolve().parent.parent
PINGPONG = REPO / "traces" / "examples" / "pingpong.json"


@pytest.fixture(scope="module")
def pingpong_h5(tmp_path_factory):
    out = tmp_path_factory.mktemp("packets") / "pp.h5"
    result = R.run_trace(PINGPONG, output=out, detail="packets", progress=False)
    return out, result


def test_packets_per_link_sum_to_the_link_totals(pingpong_h5):
    path, result = pingpong_h5
    with h5py.File(path) as f:
        g = f["packets"]
        assert f.attrs["detail"] == "packets"
        link, wire = g["link"][()], g["wire_bytes"][()]
        dur = g["end_ps"][()] - g["start_ps"][()]
        nlinks = f["links/bytes"].shape[0]
        np.testing.assert_array_equal(np.bincount(link, weights=wire, minlength=nlinks), f["links/bytes"][()])
        np.testing.assert_array_equal(np.bincount(link, weights=dur, minlength=nlinks), f["links/busy_ps"][()])
        assert link.size == result.packets_sent
        assert np.all(np.diff(g["start_ps"][()]) >= 0)
        for name in ("start_ps", "end_ps", "link", "msg", "op", "seq", "wire_bytes", "type"):
            ds = g[name]
            assert ds.chunks is not None and ds.compression == "gzip", name
        assert g["start_ps"].attrs["unit"] == "ps" and g["wire_bytes"].attrs["unit"] == "B"
        assert set(h5py.check_enum_dtype(g["type"].dtype)) == set(PACKET_TYPE_NAMES)


def test_every_message_has_all_its_packets(pingpong_h5):
    path, _ = pingpong_h5
    with h5py.File(path) as f:
        msg, seq, op = f["packets/msg"][()], f["packets/seq"][()], f["packets/op"][()]
        send_op, packets = f["messages/send_op"][()], f["messages/packets"][()]
        ops_end = f["ops/end_ps"][()]
        for m in range(send_op.size):
            mine = msg == m
            assert np.array_equal(np.unique(seq[mine]), np.arange(packets[m])), m
            assert np.all(op[mine] == send_op[m])  # writes: moved by their send
        assert np.all(msg >= 0)  # pingpong has no collectives
        # A packet leaves before the trace's last op ends.
        assert f["packets/end_ps"][()].max() <= ops_end.max()


def test_reader_packets_with_and_without_pandas(pingpong_h5, monkeypatch):
    path, result = pingpong_h5
    with Timeline(path, as_numpy=True) as t:
        p = t.packets()
        assert t.has_packets()
        assert p.dtype.names == ("start_ps", "end_ps", "dur_ps", "link", "msg", "op", "seq", "wire_bytes", "type")
        assert set(p["type"]) <= {"WRITE"} and p.size == result.packets_sent
        assert np.all(p["dur_ps"] > 0)
    monkeypatch.setitem(sys.modules, "pandas", None)  # as in CI: no pandas
    with open_timeline(path) as t:
        p = t.packets()
        assert isinstance(p, np.ndarray) and p.size == result.packets_sent


def test_default_runs_have_no_packets(tmp_path):
    out = tmp_path / "d.h5"
    R.run_trace(PINGPONG, output=out, progress=False)
    with h5py.File(out) as f:
        assert "packets" not in f and f.attrs["detail"] == "tasks"
    with open_timeline(out) as t:
        assert not t.has_packets()
        with pytest.raises(TimelineError, match="--detail packets"):
            t.packets()


def test_collective_packets_point_at_the_collective(tmp_path):
    ranks = [0, 2, 4, 6]
    nodes = [{"id": i, "name": "ar", "type": "COMM_COLL", "rank": r, "stream": 1,
              "attrs": {"cmemu.group": "g", "comm_type": "ALL_REDUCE", "comm_size": 65536}}
             for i, r in enumerate(ranks)]
    trace = tmp_path / "ar.json"
    trace.write_text(json.dumps({"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini",
                                 "groups": {"g": ranks}, "nodes": nodes}))
    out = tmp_path / "ar.h5"
    R.run_trace(trace, output=out, detail="packets", progress=False)
    with open_timeline(out, ) as t:
        p = t.packets()
        links = t.columns("links")
        ops = t.columns("ops")
    assert len(p) > 0
    np.testing.assert_array_equal(np.bincount(np.asarray(p["link"]), weights=np.asarray(p["wire_bytes"]),
                                              minlength=links["bytes"].size), links["bytes"])
    assert np.all(np.asarray(p["msg"]) == -1)  # internal messages: not rows of /messages
    op = np.asarray(p["op"])
    assert np.all((op >= 0) & (op < len(nodes)))
    assert set(np.unique(op)) == set(range(len(nodes)))  # every member's collective moved packets
    assert np.all(ops["type"][op] == ops["type"][0])


def test_large_packet_detail_warns_with_the_estimate(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cmemu.run.memory, "PACKET_RECORDS_WARN", 10)
    R.run_trace(PINGPONG, output=tmp_path / "w.h5", detail="packets", progress=False)
    err = capsys.readouterr().err
    assert "warning" in err and "packet records" in err and "--detail tasks" in err
    # The estimate: packets x links per packet (256 + 1 packets of pingpong's two messages).
    assert f"{257 * R.PACKET_RECORD_LINKS:,}" in err
    # No warning without --detail packets.
    R.run_trace(PINGPONG, output=tmp_path / "t.h5", progress=False)
    assert "warning" not in capsys.readouterr().err


def test_too_many_packet_records_are_refused_before_the_run(monkeypatch, tmp_path):
    monkeypatch.setattr(cmemu.run.memory, "PACKET_RECORDS_MAX", 100)
    out = tmp_path / "r.h5"
    with pytest.raises(R.MemoryLimitError) as exc:
        R.run_trace(PINGPONG, output=out, detail="packets", progress=False)
    msg = str(exc.value)
    assert f"{257 * R.PACKET_RECORD_LINKS:,} packet records" in msg and "100" in msg and "--detail tasks" in msg
    assert not out.exists()


def test_packet_records_count_in_the_memory_limit(tmp_path):
    from cmemu.spec import load_system
    from cmemu.topology import build_topology
    from cmemu.trace import load_trace

    topo = build_topology(load_system("mini"))
    trace = load_trace(PINGPONG, num_ranks=topo.spec.dies)
    plain = R.estimate_memory(trace, topo)
    need = R.estimate_memory(trace, topo, detail="packets")
    assert plain.records_bytes == 0 and need.packet_records == 257 * R.PACKET_RECORD_LINKS
    assert need.total_bytes == plain.total_bytes + need.packet_records * R.PACKET_RECORD_BYTES
    # Above --max-memory only because of the records: refused, naming the records and the limit.
    limit = (plain.total_bytes + need.total_bytes) // 2
    R.run_trace(PINGPONG, progress=False, max_memory_bytes=limit)  # fits without them
    with pytest.raises(R.MemoryLimitError, match=r"packet records.*memory limit.*--detail tasks"):
        R.run_trace(PINGPONG, output=tmp_path / "m.h5", detail="packets", progress=False, max_memory_bytes=limit)


def test_cli_detail_packets(cli, tmp_path):
    out = tmp_path / "c.h5"
    proc = cli("run", PINGPONG, "-o", out, "--detail", "packets", "-q")
    # Small: no warning (a kernel's first compile in a fresh checkout tells so, once, and is no warning).
    assert proc.stderr.replace(COMPILE_NOTICE + "\n", "") == ""
    with h5py.File(out) as f:
        assert f["packets/link"].shape[0] > 0


def test_writer_checks_the_records_against_the_links(pingpong_h5, tmp_path):
    import dataclasses

    from cmemu.output import hdf5

    _, r = pingpong_h5
    bad = dict(r.packets)
    bad["wire_bytes"] = bad["wire_bytes"] + 1
    with pytest.raises(ValueError, match="sum to"):
        hdf5.write_timeline(tmp_path / "x.h5", dataclasses.replace(r, packets=bad), detail="packets")
    with pytest.raises(ValueError, match="RunResult.packets"):
        hdf5.write_timeline(tmp_path / "y.h5", dataclasses.replace(r, packets=None), detail="packets")
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "y.h5").exists()
