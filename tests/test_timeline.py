"""The HDF5 timeline, layout v2: write -> read round trip of every dataset, compression and chunking,
a golden small timeline (tests/data/), version handling (v1 still reads, unknown versions are
refused), and the Python API (cmemu.open_timeline) with and without pandas."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import cmemu
from cmemu.errors import CmemuError
from cmemu.output import hdf5
from cmemu.output.reader import Timeline, TimelineError, open_timeline
from cmemu.output.schema import TIMELINE_VERSION
from cmemu.results.overlap import busy_union_ps, exposed_comm_by_type_ps
from cmemu.run import run_trace
from cmemu.topology import LINK_KIND_NAMES
from cmemu.vocab import NODE_TYPES, PIPE_CODE, PIPE_NAMES

DATA = Path(__file__).resolve().parent / "data"
TINY = DATA / "tiny_timeline_trace.json"
TINY_V1 = DATA / "tiny_v1.h5"
LAYOUT = DATA / "tiny_layout.json"
COMP, SEND, RECV, LOAD, STORE = range(5)


def synthetic_tasks(r) -> dict:
    """Tasks a die model could record: each COMP op on two CUBE cores at once (overlapping tasks)
    after an MTE2 load of its first half, and each COMM_SEND on SDMA."""
    L = r.lowered
    comp = np.flatnonzero(L.op_type == COMP)
    send = np.flatnonzero(L.op_type == SEND)
    s, e = r.op_start_ps, r.op_end_ps
    ops = np.concatenate([comp, comp, comp, send])
    pipe = np.concatenate([np.full(comp.size * 2, PIPE_CODE["CUBE"]), np.full(comp.size, PIPE_CODE["MTE2"]),
                           np.full(send.size, PIPE_CODE["SDMA"])])
    start = np.concatenate([s[comp], s[comp], s[comp], s[send]])
    end = np.concatenate([e[comp], e[comp], (s[comp] + e[comp]) // 2, e[send]])
    nbytes = np.concatenate([np.zeros(2 * comp.size, np.int64), np.full(comp.size, 4096), L.op_bytes[send]])
    return {"die": L.op_rank[ops], "pipe": pipe.astype(np.uint8), "op": ops.astype(np.int32),
            "start_ps": start, "end_ps": end, "bytes": nbytes}


def synthetic_link_series(r, bin_ps=1_000_000) -> dict:
    """Binned counters that add up to the run's link totals: each busy link's traffic split over
    two bins (bin_ps is larger than any link's total busy time in the tiny run)."""
    links = np.flatnonzero(r.link_busy_ps > 0)
    assert r.link_busy_ps.max() <= bin_ps
    half_b, half_t = r.link_bytes[links] // 2, r.link_busy_ps[links] // 2
    first = links % 3
    return {"bin_ps": bin_ps,
            "link": np.concatenate([links, links]).astype(np.int32),
            "bin": np.concatenate([first, first + 1]).astype(np.int32),
            "bytes": np.concatenate([half_b, r.link_bytes[links] - half_b]),
            "busy_ps": np.concatenate([half_t, r.link_busy_ps[links] - half_t])}


@pytest.fixture(scope="module")
def tiny():
    """The tiny run, without tasks or binned link counters (whatever the engine records)."""
    return dataclasses.replace(run_trace(TINY, progress=False), tasks=None, link_series=None)


def synthetic_moe_pairs(r) -> dict:
    """A dispatch/combine pair the writer accepts: the first two ops of one rank."""
    rank = r.lowered.op_rank
    first = np.flatnonzero(rank == rank[0])[:2]
    return {"dispatch_op": first[:1].astype(np.int32), "combine_op": first[1:2].astype(np.int32)}


def with_records(r, **kw):
    return dataclasses.replace(r, **{"tasks": synthetic_tasks(r), "link_series": synthetic_link_series(r),
                                     "moe_pairs": synthetic_moe_pairs(r), **kw})


@pytest.fixture(scope="module")
def tiny_full(tiny, tmp_path_factory):
    """The tiny run with tasks and binned link counters, written as v2."""
    path = tmp_path_factory.mktemp("tl") / "tiny_full.h5"
    hdf5.write_timeline(path, with_records(tiny))
    return path


def _read(path, name):
    with h5py.File(path) as f:
        ds = f[name]
        return ds.asstr()[()] if h5py.check_string_dtype(ds.dtype) else ds[()]


# -- round trip ---------------------------------------------------------------------------
def test_round_trip_every_dataset(tiny, tiny_full):
    r, L = tiny, tiny.lowered
    expected = {
        "ops/node_id": L.op_node_id, "ops/rank": L.op_rank, "ops/stream": L.op_stream,
        "ops/type": L.op_type, "ops/name": np.asarray(L.op_name, dtype=object),
        "ops/start_ps": r.op_start_ps, "ops/end_ps": r.op_end_ps, "ops/bytes": L.op_bytes,
        "messages/send_op": L.msg_send_op, "messages/recv_op": L.msg_recv_op,
        "messages/bytes": L.msg_bytes, "messages/packets": r.msg_packets,
        "links/src_vertex": r.topology.link_src, "links/dst_vertex": r.topology.link_dst,
        "links/kind": r.topology.link_kind, "links/rate_byte_per_s": r.topology.link_rate_byte_per_s,
        "links/latency_ps": r.topology.link_latency_ps, "links/bytes": r.link_bytes,
        "links/busy_ps": r.link_busy_ps,
    }
    tasks = synthetic_tasks(r)
    for k, v in tasks.items():
        expected[f"tasks/{k}"] = v
    series = synthetic_link_series(r)
    order = np.lexsort((series["link"], series["bin"]))  # stored sorted by bin, then link
    for k in ("link", "bin", "bytes", "busy_ps"):
        expected[f"links/binned/{k}"] = series[k][order]
    for k, v in synthetic_moe_pairs(r).items():
        expected[f"moe_pairs/{k}"] = v
    with h5py.File(tiny_full) as f:
        stored = []
        f.visititems(lambda name, obj: stored.append(name) if isinstance(obj, h5py.Dataset) else None)
        assert f["links/binned"].attrs["bin_ps"] == series["bin_ps"]
        assert f["tasks"].attrs["status"] == hdf5.TASKS_RECORDED
    dies_sets = {n for n in stored if n.startswith("dies/")}
    assert set(stored) - dies_sets == set(expected), "every dataset is checked here"
    for name, want in expected.items():
        got = _read(tiny_full, name)
        assert got.shape == np.shape(want), name
        assert np.array_equal(got, want), name
    # The API returns the same values with names for enums.
    with open_timeline(tiny_full) as t:
        ops = t.ops()
        assert list(ops["type"]) == [NODE_TYPES[c] for c in L.op_type]
        assert list(ops["name"]) == L.op_name
        assert np.array_equal(ops["dur_ps"], r.op_end_ps - r.op_start_ps)
        tk = t.tasks()
        assert list(tk["pipe"]) == [PIPE_NAMES[c] for c in tasks["pipe"]]
        assert np.array_equal(tk["start_ps"], tasks["start_ps"])
        lk = t.links()
        assert list(lk["kind"]) == [LINK_KIND_NAMES[c] for c in r.topology.link_kind]
        assert np.allclose(lk["utilisation"], r.link_busy_ps / r.sim_end_ps)
        bins = t.link_bins()
        assert np.array_equal(bins["start_ps"], expected["links/binned/bin"] * series["bin_ps"])
        m = t.messages()
        assert np.array_equal(m["src_rank"], L.op_rank[L.msg_send_op])
        assert np.array_equal(m["recv_end_ps"], r.op_end_ps[L.msg_recv_op])
        assert t.attrs["detail"] == "tasks" and t.spec["name"] == "mini"


@pytest.mark.parametrize("compression, filter_name", [("gzip", "gzip"), ("lzf", "lzf"), ("none", None)])
def test_compression_choices_are_chunked_and_read_back(tiny, tmp_path, compression, filter_name):
    path = hdf5.write_timeline(tmp_path / "t.h5", tiny, compression=compression)
    with h5py.File(path) as f:
        for name in ("ops/start_ps", "ops/name", "links/busy_ps", "dies/busy_ps", "tasks/start_ps"):
            assert f[name].chunks is not None, name
            assert f[name].compression == filter_name, name
            assert f[name].shuffle == (filter_name is not None), name
        assert np.array_equal(f["ops/end_ps"][()], tiny.op_end_ps)


def test_writes_chunk_by_chunk(tiny, tmp_path, monkeypatch):
    """With a chunk of 5 rows the 12 ops go to the file in three writes and come back whole."""
    monkeypatch.setattr(hdf5, "CHUNK_ROWS", 5)
    path = hdf5.write_timeline(tmp_path / "t.h5", tiny)
    with h5py.File(path) as f:
        assert f["ops/start_ps"].chunks == (5,)
        assert list(f["ops/name"].asstr()[()]) == tiny.lowered.op_name
        assert np.array_equal(f["ops/start_ps"][()], tiny.op_start_ps)


def test_bad_compression_is_an_error(tiny, tmp_path):
    with pytest.raises(CmemuError, match="--compression"):
        hdf5.write_timeline(tmp_path / "t.h5", tiny, compression="zstd")
    assert not list(tmp_path.iterdir())


# -- /tasks and --detail --------------------------------------------------------------------
def test_tasks_group_is_empty_and_says_why_when_none(tiny, tmp_path):
    path = hdf5.write_timeline(tmp_path / "t.h5", tiny)
    with h5py.File(path) as f:
        g = f["tasks"]
        assert g.attrs["status"] == hdf5.TASKS_NOT_RECORDED
        assert set(g) == {"die", "pipe", "op", "start_ps", "end_ps", "bytes"}
        assert all(g[k].shape == (0,) for k in g)
        assert h5py.check_enum_dtype(g["pipe"].dtype) == {n: i for i, n in enumerate(PIPE_NAMES)}
        assert "binned" not in f["links"]  # no series given: nothing derived
    with open_timeline(path) as t:
        assert len(t.tasks()) == 0 and not t.has_tasks() and t.link_bins() is None


def test_detail_ops_omits_recorded_tasks(tiny, tmp_path):
    path = hdf5.write_timeline(tmp_path / "t.h5", with_records(tiny), detail="ops")
    with h5py.File(path) as f:
        assert f["tasks"].attrs["status"] == hdf5.TASKS_OMITTED and f["tasks/die"].shape == (0,)
        assert f.attrs["detail"] == "ops"


def test_detail_packets_writes_packets(cli, tmp_path):
    # The /packets group itself: tests/test_packets.py.
    out = tmp_path / "o.h5"
    cli("run", TINY, "-o", out, "--detail", "packets", "-q")
    with h5py.File(out) as f:
        assert f.attrs["detail"] == "packets" and "packets" in f


@pytest.mark.parametrize("change, words", [
    (lambda s: s.update(bytes=s["bytes"] + 1), "sum to"),
    (lambda s: s.update(bin_ps=0), "bin_ps"),
    (lambda s: s.update(busy_ps=s["busy_ps"] + 10**9), "busy_ps"),
    (lambda s: s.pop("bin"), "lacks bin"),
    (lambda s: s.update(link=np.concatenate([s["link"][:1], s["link"]]),
                        bin=np.concatenate([s["bin"][:1], s["bin"]]),
                        bytes=np.concatenate([[0], s["bytes"]]), busy_ps=np.concatenate([[0], s["busy_ps"]])),
     "twice"),
])
def test_link_series_is_checked_against_the_run(tiny, tmp_path, change, words):
    series = synthetic_link_series(tiny)
    change(series)
    with pytest.raises(ValueError, match=words):
        hdf5.write_timeline(tmp_path / "t.h5", dataclasses.replace(tiny, link_series=series))
    assert not list(tmp_path.iterdir()), "no file, not even a temporary one"


@pytest.mark.parametrize("bin_scale", [1, 300_000])  # the bins' range narrow, or far wider than the rows
def test_binned_rows_are_written_in_file_order_whatever_their_order(tiny, tmp_path, bin_scale):
    # The engine gives its link counters by (link, bin) and the HBM stack series by (die, bin,
    # stack), which the writer sorts by less; any other order gives the same file.
    series = synthetic_link_series(tiny)
    series["bin"] = series["bin"] * bin_scale
    by_link = np.lexsort((series["bin"], series["link"]))
    rng = np.random.default_rng(3)
    stacks = tiny.hbm_stack_series
    assert np.all(np.diff(stacks["die"].astype(np.int64) * 2**40 + stacks["bin"] * 64 + stacks["stack"]) > 0)
    shuffled = rng.permutation(len(stacks["die"]))
    files = []
    for link_rows, stack_rows in ((by_link, slice(None)), (rng.permutation(by_link.size), shuffled)):
        r = dataclasses.replace(tiny, link_series={k: v if k == "bin_ps" else v[link_rows] for k, v in series.items()},
                                hbm_stack_series={k: v if k in ("bin_ps", "stacks") else v[stack_rows]
                                                  for k, v in stacks.items()})
        files.append(hdf5.write_timeline(tmp_path / f"{len(files)}.h5", r))
    with h5py.File(files[0]) as a, h5py.File(files[1]) as b:
        for group in ("links/binned", "dies/hbm_stack_binned"):
            for name in a[group]:
                np.testing.assert_array_equal(a[group][name][()], b[group][name][()], err_msg=f"{group}/{name}")
        bins, link = a["links/binned/bin"][()], a["links/binned/link"][()]
        assert np.all(np.diff(bins.astype(np.int64) * 2**32 + link) > 0)  # by bin, then link
        assert np.array_equal(bins, np.sort(series["bin"]))


def test_tasks_are_checked(tiny, tmp_path):
    tasks = synthetic_tasks(tiny)
    tasks["pipe"] = tasks["pipe"].copy()
    tasks["pipe"][0] = len(PIPE_NAMES)
    with pytest.raises(ValueError, match="pipe code"):
        hdf5.write_timeline(tmp_path / "t.h5", dataclasses.replace(tiny, tasks=tasks))


# -- golden: the tiny trace, by hand -----------------------------------------------------------
def test_golden_tiny_timeline_by_hand(tiny_full):
    """Fixed-duration COMP ops give times known without any model; communication and HBM times
    come from the models, so only their relations and the figures derived from them are checked."""
    ops = {k: _read(tiny_full, f"ops/{k}") for k in ("start_ps", "end_ps", "rank", "type")}
    s, e = ops["start_ps"], ops["end_ps"]
    # node: 0 prologue, 1 send_x, 2 recv_x, 3 overlap, 4 after_recv, 5 load_w, 6 send_twin,
    # 7 recv_twin, 8 epilogue, 9 send_far, 10 recv_far, 11 store_out
    assert (s[0], e[0]) == (0, 1_000_000)  # 1000 ns
    assert (s[3], e[3]) == (0, 500_000)
    assert s[1] == 1_000_000  # stream order after the prologue
    assert (s[4], e[4]) == (e[2], e[2] + 250_000)
    assert (s[8], e[8]) == (e[7], e[7] + 100_000)
    assert s[5] == 500_000 and s[11] == e[10]
    assert e[2] > s[1] and e[7] > s[6] and e[10] > s[9]  # a message arrives after it is sent
    d = {k: _read(tiny_full, f"dies/{k}") for k in ("busy_ps", "any_busy_ps", "exposed_comm_ps", "bytes_sent",
                                                     "bytes_received", "hbm_read_bytes", "hbm_write_bytes",
                                                     "node", "npu", "die_in_npu")}
    assert d["busy_ps"].shape == (32, len(NODE_TYPES))
    assert d["busy_ps"][0, COMP] == 1_000_000
    assert d["busy_ps"][2, COMP] == 500_000 + 250_000
    assert d["busy_ps"][3, COMP] == 100_000
    assert d["busy_ps"][2, RECV] == e[2] and d["busy_ps"][2, LOAD] == e[5] - s[5]
    assert d["any_busy_ps"][0] == e[1]  # prologue then send, back to back
    # Die 2 waits for recv_x from 0 to e[2]; overlap and load_w run from 0 to e[5] (back to back).
    assert d["exposed_comm_ps"][2] == max(0, e[2] - e[5])
    assert d["exposed_comm_ps"][3] == e[7]  # nothing else runs on die 3 while it waits
    assert d["exposed_comm_ps"][16] == e[10]
    assert d["exposed_comm_ps"][0] == 0
    sent = np.zeros(32, np.int64)
    sent[[0, 2, 3]] = [4096, 8192, 512]
    recv = np.zeros(32, np.int64)
    recv[[2, 3, 16]] = [4096, 8192, 512]
    assert np.array_equal(d["bytes_sent"], sent) and np.array_equal(d["bytes_received"], recv)
    assert d["hbm_read_bytes"][2] == 1048576 and d["hbm_read_bytes"].sum() == 1048576
    assert d["hbm_write_bytes"][16] == 65536 and d["hbm_write_bytes"].sum() == 65536
    # mini: 2 nodes x 8 NPUs x 2 dies; die 16 is node 1's first die.
    assert (d["node"][16], d["npu"][16], d["die_in_npu"][16]) == (1, 8, 0)
    assert (d["node"][3], d["npu"][3], d["die_in_npu"][3]) == (0, 1, 1)


def layout_of(path) -> dict:
    """Every group and dataset: dtype, rank, unit; root and group attribute names."""
    out = {}
    with h5py.File(path) as f:
        out["/"] = {"attrs": sorted(f.attrs)}

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                enum = h5py.check_enum_dtype(obj.dtype)
                out[name] = {"dtype": "str" if h5py.check_string_dtype(obj.dtype) else obj.dtype.str,
                             "ndim": obj.ndim, "unit": obj.attrs.get("unit", ""),
                             "enum": sorted(enum, key=enum.get) if enum else None}
            else:
                out[name] = {"attrs": sorted(obj.attrs)}
        f.visititems(visit)
    return out


def test_layout_is_the_frozen_one_or_the_version_changed(tiny_full):
    """tests/data/tiny_layout.json freezes the v2 layout (names, dtypes, units, enums, attributes).
    A change of layout must come with a new TIMELINE_VERSION and docs. To regenerate after such a
    change: python tests/test_timeline.py --freeze-layout"""
    frozen = json.loads(LAYOUT.read_text())
    assert frozen["version"] == TIMELINE_VERSION, "layout version changed: regenerate the frozen layout"
    assert layout_of(tiny_full) == frozen["layout"]


# -- versions ----------------------------------------------------------------------------------
def test_v1_file_still_reads(tiny, tiny_full):
    """tests/data/tiny_v1.h5 was written by cmemu 0.1.0 (layout v1) from the same tiny trace."""
    with open_timeline(TINY_V1) as old, open_timeline(tiny_full) as new:
        assert old.version == 1 and new.version == TIMELINE_VERSION
        a, b = old.ops(), new.ops()
        for col in ("node_id", "rank", "stream", "type", "name", "bytes"):
            assert list(a[col]) == list(b[col]), col
        assert len(old.tasks()) == 0 and old.link_bins() is None
        assert "version 1" in old.tasks_status()
        # /dies does not exist in v1: it is derived the same way the writer derives it.
        da, db = old.dies_columns(), new.dies_columns()
        for k in ("bytes_sent", "bytes_received", "hbm_read_bytes", "hbm_write_bytes", "node"):
            assert np.array_equal(da[k], db[k]), k
        assert old.summary()["ops"] == 12 and old.summary()["messages"] == 3
        # The old file knows only the links of its day (v3 adds the VPC plane's); those it has
        # read the same way.
        n_old = len(old.links())
        assert n_old == 1104 and len(new.links()) == 1104 + 84
        assert list(old.links()["kind"]) == list(new.links()["kind"][:n_old])


def test_v3_file_reads_and_says_what_it_lacks(tiny_full, tmp_path):
    """A v3 file (no per-stack HBM bins, no /moe_pairs) still reads; asking for what it lacks
    names the version that added it."""
    path = tmp_path / "v3.h5"
    path.write_bytes(Path(tiny_full).read_bytes())
    with h5py.File(path, "r+") as f:
        f.attrs["version"] = 3
        del f["moe_pairs"]
        if "dies/hbm_stack_binned" in f:
            del f["dies/hbm_stack_binned"]
    with open_timeline(path) as t:
        assert t.version == 3 and len(t.ops()) == 12
        assert t.hbm_stack_bins() is None and not t.has_moe_pairs()
        with pytest.raises(TimelineError, match=r"no /moe_pairs: this file has layout version 3, /moe_pairs came "
                                                r"with version 4"):
            t.moe_pairs()


def test_hbm_stack_bins_add_up_to_the_die_bins(tiny, tmp_path):
    """Per-stack HBM bytes (v4) sum to the per-die bins, and each op's bytes are split as the
    interleave puts them (cmemu.die.hbm.stack_bytes)."""
    from cmemu.die.hbm import HBMParams, stack_bytes

    assert tiny.hbm_stack_series is not None
    path = hdf5.write_timeline(tmp_path / "s.h5", tiny)
    with Timeline(path, as_numpy=True) as t:
        per_die, per_stack = t.hbm_bins(), t.hbm_stack_bins()
        assert t.hbm_stacks == tiny.spec.die.hbm_stacks == 4
    want = {}
    for d, b, n in zip(per_die["die"], per_die["bin"], per_die["bytes"]):
        want[(d, b)] = n
    got = {}
    for d, b, n in zip(per_stack["die"], per_stack["bin"], per_stack["bytes"]):
        got[(d, b)] = got.get((d, b), 0) + n
    assert got == want and per_stack["stack"].max() < 4
    hp = HBMParams.from_die(tiny.spec.die)
    L = tiny.lowered
    total = stack_bytes(hp, L.op_hbm_bytes).sum(axis=0)
    by_stack = np.bincount(per_stack["stack"], weights=per_stack["bytes"], minlength=4)
    assert by_stack.tolist() == total.tolist()
    # The writer refuses stacks that do not add up to the die.
    bad = dict(tiny.hbm_stack_series, bytes=tiny.hbm_stack_series["bytes"] + 1)
    with pytest.raises(ValueError, match="stacks of die"):
        hdf5.write_timeline(tmp_path / "bad.h5", dataclasses.replace(tiny, hbm_stack_series=bad))


def test_unknown_version_is_refused_clearly(tiny_full, tmp_path):
    path = tmp_path / "future.h5"
    path.write_bytes(Path(tiny_full).read_bytes())
    with h5py.File(path, "r+") as f:
        f.attrs["version"] = 99
    with pytest.raises(TimelineError, match=r"version 99 .* reads versions 1, 2"):
        open_timeline(path)


def test_not_a_timeline_is_refused(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "something.else"
    with pytest.raises(TimelineError, match="not a cmemu timeline"):
        open_timeline(path)
    with pytest.raises(TimelineError, match="no such file"):
        open_timeline(tmp_path / "missing.h5")


# -- the API -----------------------------------------------------------------------------------
def test_numpy_structured_arrays_without_pandas(tiny_full, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with open_timeline(tiny_full) as t:
        ops = t.ops()
        assert isinstance(ops, np.ndarray) and ops.dtype.names[:3] == ("node_id", "rank", "stream")
        assert ops["type"][0] == "COMP" and ops["name"][0] == "prologue"
        assert isinstance(t.tasks(), np.ndarray) and isinstance(t.links(), np.ndarray)
        assert isinstance(t.messages(), np.ndarray) and isinstance(t.dies(), np.ndarray)


def test_summary_figures(tiny_full):
    with open_timeline(tiny_full) as t:
        s = t.summary()
        e = t.ops()["end_ps"]
    assert s["makespan_us"] == max(e) / 1e6
    assert s["op_types"]["COMP"]["count"] == 4
    assert s["op_types"]["COMP"]["total_time_us"] == pytest.approx((1000 + 500 + 250 + 100) / 1e3)
    assert s["exposed_comm"]["die_max"] in (3, 16)
    json.dumps(s)  # JSON-able


def test_import_cmemu_does_no_work_and_exports_open_timeline():
    code = ("import sys, cmemu; assert 'h5py' not in sys.modules and 'numpy' not in sys.modules; "
            "f = cmemu.open_timeline; print(f.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "cmemu.output.reader"
    assert cmemu.open_timeline is open_timeline and isinstance(open_timeline(TINY_V1), Timeline)


# -- the interval sweeps -----------------------------------------------------------------------
def test_busy_union_counts_overlap_once():
    key = np.array([0, 0, 0, 1, 1])
    start = np.array([0, 5, 20, 3, 3])
    end = np.array([10, 12, 20, 4, 9])
    # key 0: [0,12) + [20,20) = 12; key 1: [3,9) = 6; key 2: nothing
    assert busy_union_ps(key, start, end, 3).tolist() == [12, 6, 0]


def test_exposed_comm_by_hand():
    # rank 0: recv [0, 100), comp [20, 50), send [60, 90) (a send does not hide the wait) -> 70
    # rank 1: recv [10, 30) and recv [20, 40) overlap -> 30; load [35, 60) hides 5 -> 25
    rank = np.array([0, 0, 0, 1, 1, 1])
    typ = np.array([RECV, COMP, SEND, RECV, RECV, LOAD])
    start = np.array([0, 20, 60, 10, 20, 35])
    end = np.array([100, 50, 90, 30, 40, 60])
    assert exposed_comm_by_type_ps(rank, typ, start, end, 3).tolist() == [70, 25, 0]
    # A collective waits for other dies too: COMM_COLL [0, 50) on rank 2 with COMP [10, 20) -> 40.
    coll = NODE_TYPES.index("COMM_COLL")
    got = exposed_comm_by_type_ps(np.array([2, 2]), np.array([coll, COMP]), np.array([0, 10]), np.array([50, 20]), 3)
    assert got.tolist() == [0, 0, 40]


if __name__ == "__main__" and "--freeze-layout" in sys.argv:
    import tempfile

    r = with_records(run_trace(TINY, progress=False))
    with tempfile.TemporaryDirectory() as d:
        p = hdf5.write_timeline(Path(d) / "t.h5", r)
        LAYOUT.write_text(json.dumps({"version": TIMELINE_VERSION, "layout": layout_of(p)}, indent=1,
                                     sort_keys=True) + "\n")
    print(f"wrote {LAYOUT}")
