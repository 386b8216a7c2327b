"""cmemu trace import ascend (cmemu/trace/importers/ascend.py) and cmemu run --retime
(cmemu/lower/retime.py), on the profiler folders of tests/data/ascend (see its README)."""
import csv
import json
import shutil
from pathlib import Path

import pytest

from cmemu.errors import CmemuError
from cmemu.spec import load_system
from cmemu.importers import import_ascend_to_file
from cmemu.trace.importers.ascend import import_ascend

DATA = Path(__file__).parent / "data" / "ascend"
MINI = load_system("mini")
CORES = (MINI.die.aic_cores, MINI.die.aiv_cores)


def imported(name, **kw):
    return import_ascend(DATA / name, MINI.dies, "mini", die_cores=CORES, **kw)


def by_name(doc):
    return {n["name"]: n for n in doc["nodes"]}


def test_torch_npu_cann8_header_two_ranks():
    r = imported("torch_npu_2ranks")
    assert r.variants == ["kernel_details with 'Start Time(us)', Stream ID"] * 2
    nodes = r.doc["nodes"]
    assert [n["rank"] for n in nodes] == [0] * 6 + [1] * 4
    mm = nodes[0]
    assert mm["stream"] == 2 and mm["attrs"] == {
        "cmemu.duration_ns": 40000.0, "cmemu.op": "gemm", "cmemu.m": 128, "cmemu.n": 2048, "cmemu.k": 7168,
        "cmemu.dtype": "bf16", "cmemu.cores": 24, "x-ascend.type": "MatMulV2"}
    assert nodes[1]["attrs"]["cmemu.op"] == "rmsnorm" and nodes[1]["attrs"]["cmemu.rows"] == 128
    assert nodes[2]["attrs"] == {"cmemu.duration_ns": 2000.0, "cmemu.unit": "aiv", "cmemu.cores": 8,
                                 "x-ascend.type": "Cast"}
    # HCCL rows have no Stream ID (N/A): a stream of their own, after the rank's others
    ar0, ar1 = nodes[3], nodes[7]
    assert ar0["type"] == ar1["type"] == "COMM_COLL" and ar0["stream"] == 3
    # communication.json: 0.5 MB moved by each of 2 ranks; a ring all-reduce moves 2(n-1)/n of the buffer
    assert ar0["attrs"]["comm_size"] == ar1["attrs"]["comm_size"] == 524288
    assert r.doc["groups"] == {ar0["attrs"]["cmemu.group"]: [0, 1]}
    # communication_matrix.json: the send's peer and size
    assert nodes[5]["type"] == "COMM_SEND" and nodes[5]["attrs"] == {"comm_dst": 1, "comm_size": 262144}
    assert nodes[9]["type"] == "COMM_RECV" and nodes[9]["attrs"] == {"comm_src": 0, "comm_size": 262144}
    # measured order across streams: the all-reduce after the Cast, the MatMul after the all-reduce
    assert ar0["ctrl_deps"] == [2] and nodes[4]["ctrl_deps"] == [3] and ar1["ctrl_deps"] == [6]
    assert r.counts["retimeable"] == 5
    assert r.unmapped.lines() == ["Cast kernels kept at their measured time (no die-model op for this kernel "
                                  "type): 1 (e.g. aclnnCast_Cast_Cast)"]


def test_torch_npu_cann63_header_without_streams():
    r = imported("torch_npu_cann63")
    assert r.variants == ["kernel_details with 'Start Time(us)', no Stream ID"]
    mm, sm, td = r.doc["nodes"]
    assert all(n["stream"] == 0 and n["rank"] == 0 for n in r.doc["nodes"])
    assert (mm["attrs"]["cmemu.op"], mm["attrs"]["cmemu.dtype"], mm["attrs"]["cmemu.k"]) == ("gemm", "fp16", 4096)
    assert sm["attrs"]["cmemu.op"] == "softmax" and sm["attrs"]["cmemu.cores"] == 40
    assert "cmemu.op" not in td["attrs"] and td["attrs"]["cmemu.duration_ns"] == 3000.0


def test_msprof_cann8_header():
    r = imported("msprof_cann8")
    assert r.variants == ["op_summary with 'Task Start Time(us)', Stream ID"]
    gmm, swiglu, quant, argmax = r.doc["nodes"]
    assert gmm["attrs"] | {} == {"cmemu.duration_ns": 120500.0, "cmemu.op": "grouped_gemm", "cmemu.m": 256,
                                 "cmemu.n": 4096, "cmemu.k": 7168, "cmemu.groups": 8, "cmemu.dtype": "int8",
                                 "cmemu.cores": 20, "x-ascend.type": "GroupedMatmul"}
    assert (swiglu["attrs"]["cmemu.rows"], swiglu["attrs"]["cmemu.cols"]) == (2048, 2048)  # the output's width
    assert quant["attrs"]["cmemu.op"] == "quant_int8"
    assert argmax["attrs"] == {"cmemu.duration_ns": 30000.0, "x-ascend.type": "ArgMaxV2"}
    assert any(line.startswith("kernels on AI_CPU") for line in r.unmapped.lines())


def test_msprof_cann601_header_start_in_ns():
    r = imported("msprof_cann601")
    assert r.variants == ["op_summary with 'Task Start Time', Stream ID"]
    norm, mm, rope = r.doc["nodes"]
    assert norm["attrs"]["cmemu.duration_ns"] == 6125.0 and mm["attrs"]["cmemu.duration_ns"] == 18750.0
    # Task Start Time in ns: the rope (stream 6) starts 7000 ns in, after the RmsNorm ended (6125 ns)
    assert rope["stream"] == 6 and rope["ctrl_deps"] == [norm["id"]]
    assert "ctrl_deps" not in mm  # stream 5: stream order only
    assert rope["attrs"]["cmemu.op"] == "rope" and rope["attrs"]["cmemu.rows"] == 64


def test_columns_are_found_by_name_not_position(tmp_path):
    src = DATA / "torch_npu_2ranks"
    dst = tmp_path / "p"
    shutil.copytree(src, dst)
    for path in dst.rglob("kernel_details.csv"):
        rows = list(csv.reader(path.open()))
        order = list(reversed(range(len(rows[0]))))
        start = rows[0].index("Start Time(us)")
        for row in rows[1:]:
            row[start] += "\t"  # as a spreadsheet-safe writer pads it: values are stripped
        with path.open("w", newline="") as f:
            csv.writer(f).writerows([[row[i] for i in order] for row in rows])
    a, b = imported("torch_npu_2ranks").doc, import_ascend(dst, MINI.dies, "mini", die_cores=CORES).doc
    a.pop("cmemu.import"), b.pop("cmemu.import")
    assert a == b


def test_deps_stream_only():
    r = imported("torch_npu_2ranks", deps="stream")
    assert not any("ctrl_deps" in n for n in r.doc["nodes"]) and r.time_deps == 0


def test_step_filter():
    assert len(imported("torch_npu_cann63", step="1").doc["nodes"]) == 3
    with pytest.raises(CmemuError, match="no kernel of step '7'"):
        imported("torch_npu_cann63", step="7")


def _copy(tmp_path, name="torch_npu_cann63"):
    dst = tmp_path / name
    shutil.copytree(DATA / name, dst)
    return dst, next(dst.rglob("*.csv"))


def test_malformed_rows_name_file_line_and_column(tmp_path):
    root, path = _copy(tmp_path)
    lines = path.read_text().splitlines()
    bad = lines[2].split(",")
    bad[5] = "fast"  # Duration(us), the 6th column
    path.write_text("\n".join([lines[0], lines[1], ",".join(bad), lines[3]]) + "\n")
    with pytest.raises(CmemuError) as exc:
        import_ascend(root, MINI.dies)
    assert str(exc.value) == f"{path}: line 3, column 6: 'Duration(us)': expected a number, got 'fast'"
    path.write_text("\n".join([lines[0], lines[1], lines[2][:40]]) + "\n")
    with pytest.raises(CmemuError, match=r"kernel_details.csv: line 3: 5 fields, the header has 14$"):
        import_ascend(root, MINI.dies)
    path.write_text(lines[0].replace("Duration(us)", "Time") + "\n" + lines[1] + "\n")
    with pytest.raises(CmemuError, match=r"kernel_details.csv: line 1: no 'Duration\(us\)' or 'Task Duration\(us\)' "
                                         r"or 'Task Duration' column"):
        import_ascend(root, MINI.dies)


def test_malformed_communication_json_names_line_and_column(tmp_path):
    root, _ = _copy(tmp_path, "torch_npu_2ranks")
    comm = next(root.rglob("communication.json"))
    comm.write_text('{"step1": {\n  "collective": [1, }\n}')
    with pytest.raises(CmemuError, match=r"communication.json: line 2, column 21: invalid JSON: Expecting value"):
        import_ascend(root, MINI.dies)


def test_missing_inputs(tmp_path):
    with pytest.raises(CmemuError, match=r"nothere: no such folder"):
        import_ascend(tmp_path / "nothere", MINI.dies)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CmemuError, match=r"empty: no kernel_details.csv \(torch_npu\) or op_summary_\*.csv"):
        import_ascend(tmp_path / "empty", MINI.dies)


def test_a_rank_outside_the_system(tmp_path):
    root, _ = _copy(tmp_path, "torch_npu_2ranks")
    info = next(root.rglob("profiler_info_1.json"))
    info.rename(info.with_name("profiler_info_40.json"))
    with pytest.raises(CmemuError, match=r"rank 40 is outside the system \(32 dies\)"):
        import_ascend(root, MINI.dies)


def test_collective_counts_must_agree(tmp_path):
    root, _ = _copy(tmp_path, "torch_npu_2ranks")
    path = next(p for p in root.rglob("kernel_details.csv") if "3001" in str(p))
    lines = [line for line in path.read_text().splitlines() if "hcom_allReduce" not in line]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CmemuError, match=r"the ranks hold different numbers of its collectives \(\{0: 1, 1: 0\}\)"):
        import_ascend(root, MINI.dies)


def test_parallel_group_info_names_the_group(tmp_path):
    root, _ = _copy(tmp_path, "torch_npu_2ranks")
    gid = "10.0.0.1%enp189s0f0_60000_0_1767225600000000"
    meta = {"parallel_group_info": {gid: {"group_name": "dp", "group_rank": 0, "global_ranks": [0, 1]}}}
    for folder in root.glob("*_ascend_pt"):
        (folder / "profiler_metadata.json").write_text(json.dumps(meta))
    doc = import_ascend(root, MINI.dies).doc
    assert doc["groups"] == {"dp": [0, 1]}
    meta["parallel_group_info"][gid]["global_ranks"] = [0, 1, 2]
    for folder in root.glob("*_ascend_pt"):
        (folder / "profiler_metadata.json").write_text(json.dumps(meta))
    r = import_ascend(root, MINI.dies)  # rank 2 was not profiled: the collectives keep their measured time
    assert [n["type"] for n in r.doc["nodes"]].count("COMM_COLL") == 0
    assert any("not all of its ranks (3)" in line for line in r.unmapped.lines())


def _run(path, **kw):
    from cmemu.run import run_trace

    return run_trace(path, progress=False, **kw)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    path = tmp_path_factory.mktemp("imp") / "two.json"
    import_ascend_to_file(DATA / "torch_npu_2ranks", path, MINI)
    return path


def test_two_ranks_replay_to_the_times_by_hand(two_ranks, tmp_path):
    r = _run(two_ranks)
    start = {n.id: int(s) for n, s in zip(r.trace.nodes, r.op_start_ps)}
    end = {n.id: int(e) for n, e in zip(r.trace.nodes, r.op_end_ps)}
    us = 1_000_000
    # rank 0: MatMul 40 us, RmsNorm 5 us, Cast 2 us, back to back on stream 2
    assert [(start[i], end[i]) for i in (0, 1, 2)] == [(0, 40 * us), (40 * us, 45 * us), (45 * us, 47 * us)]
    # the all-reduce on rank 0 after its Cast (measured order), on rank 1 after its 60 us MatMul
    assert start[3] == 47 * us and (start[6], end[6], start[7]) == (0, 60 * us, 60 * us)
    # the same all-reduce alone, both members starting at 0, takes D: the last to arrive ends D later
    doc = json.loads(two_ranks.read_text())
    doc["nodes"] = [{k: v for k, v in n.items() if k != "ctrl_deps"} for n in doc["nodes"] if n["type"] == "COMM_COLL"]
    alone = tmp_path / "alone.json"
    alone.write_text(json.dumps(doc))
    a = _run(alone)
    d = int(a.op_end_ps.max())
    assert d > 0 and end[7] == 60 * us + d and 60 * us <= end[3] <= end[7]
    # then each rank's 40 us MatMul; the message after both MatMuls
    assert (start[4], end[4]) == (end[3], end[3] + 40 * us) and (start[8], end[8]) == (end[7], end[7] + 40 * us)
    assert start[5] == end[4] and start[9] == end[8] and end[9] >= start[5]


def test_retime_reports_measured_against_modelled(two_ranks):
    from cmemu.lower.compute import comp_cost
    from cmemu.trace import load_trace

    r = _run(two_ranks, retime=True)
    rep = r.retime
    assert (rep.candidates, rep.retimed, rep.fixed) == (5, 5, 1)
    assert rep.measured_ns == pytest.approx(40e3 + 5e3 + 40e3 + 60e3 + 40e3)
    trace = load_trace(two_ranks, MINI.dies)
    model = {}
    for n in trace.nodes:
        if "cmemu.op" in n.attrs:
            attrs = {k: v for k, v in n.attrs.items() if k != "cmemu.duration_ns"}
            from dataclasses import replace

            model[n.id] = comp_cost(replace(n, attrs=attrs), MINI.die, "t").duration_ps / 1000
    assert rep.modelled_ns == pytest.approx(sum(model.values()))
    ratios = {i: model[i] / trace.by_id[i].attrs["cmemu.duration_ns"] for i in model}
    assert rep.largest[0][:2] == (pytest.approx(max(ratios.values())), max(ratios, key=ratios.get))
    assert rep.smallest[0][:2] == (pytest.approx(min(ratios.values())), min(ratios, key=ratios.get))
    # the re-timed MatMul of rank 0 runs for the die model's time (nothing else on its die then)
    assert int(r.op_end_ps[0] - r.op_start_ps[0]) == round(model[0] * 1000)
    assert rep.line().startswith("retime: 5 of 5 measured ops with a shape re-timed by the die model: measured "
                                 "185.000 us, modelled ")
    # without --retime the measured times stand
    assert _run(two_ranks).retime is None


def test_retime_keeps_what_the_die_model_refuses(tmp_path):
    nodes = [{"id": 0, "type": "COMP", "rank": 0, "attrs": {"cmemu.duration_ns": 1000, "cmemu.op": "gemm",
                                                            "cmemu.m": 64, "cmemu.n": 64, "cmemu.k": 64,
                                                            "cmemu.dtype": "fp32"}},
             {"id": 1, "type": "COMP", "rank": 0, "attrs": {"cmemu.duration_ns": 500}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini",
                                "nodes": nodes}))
    r = _run(path, retime=True)
    assert (r.retime.candidates, r.retime.retimed) == (1, 0)
    assert "1 kept their measured time: the die model refuses them (the cube has no fp32 mode" in r.retime.line()
    assert int(r.op_end_ps.max()) == 1_500_000


def test_a_measured_time_beside_an_op_is_valid_and_work_is_not(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from cmemu.trace import check_trace, schema_path

    schema = json.loads(schema_path().read_text())
    op = {"cmemu.op": "rmsnorm", "cmemu.rows": 8, "cmemu.cols": 64}
    for attrs, ok in (({**op, "cmemu.duration_ns": 12.5}, True), ({**op, "num_ops": 5}, False)):
        doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns",
               "nodes": [{"id": 0, "type": "COMP", "rank": 0, "attrs": attrs}]}
        assert (check_trace(doc, "t.json", 32) == []) == ok
        if ok:
            jsonschema.validate(doc, schema)
        else:
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(doc, schema)


def test_cli_import_and_retime(tmp_path):
    from click.testing import CliRunner

    from cmemu.cli import main

    out = tmp_path / "t.jsonl"
    res = CliRunner().invoke(main, ["trace", "import", "ascend", str(DATA / "msprof_cann8"), "-o", str(out),
                                    "-s", "mini"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0].startswith(f"wrote {out}: 4 nodes (COMP 4) on 1 rank(s) from 1 profile(s)")
    assert "not mapped: kernels on AI_CPU" in res.output
    res = CliRunner().invoke(main, ["run", str(out), "-o", str(tmp_path / "t.h5"), "--retime"])
    assert res.exit_code == 0, res.output
    assert "retime: 3 of 3 measured ops with a shape re-timed by the die model" in res.output
    res = CliRunner().invoke(main, ["trace", "import", "ascend", str(tmp_path / "none"), "-o", str(out)])
    assert res.exit_code == 2 and res.output.strip().endswith("none: no such folder")


def test_send_and_receive_peers_from_the_hccl_tasks_of_the_timeline(tmp_path):
    root, _ = _copy(tmp_path, "torch_npu_2ranks")
    for path in root.rglob("communication_matrix.json"):
        path.unlink()
    nodes = import_ascend(root, MINI.dies).doc["nodes"]
    # rank 0's Memcpy of 262144 B to rank 1 inside hcom_send; rank 1's Notify_Wait on rank 0 inside hcom_receive
    assert nodes[5]["attrs"] == {"comm_dst": 1, "comm_size": 262144}
    assert nodes[9]["attrs"] == {"comm_src": 0, "comm_size": 262144}
    for path in root.rglob("trace_view.json"):
        path.unlink()
    r = import_ascend(root, MINI.dies)
    assert [n["type"] for n in r.doc["nodes"]][5] == "COMP"
    assert any(line.startswith("sends without a peer") for line in r.unmapped.lines())


def test_collective_sizes_from_shapes_and_unmapped_hccl_ops(tmp_path):
    root, path = _copy(tmp_path, "torch_npu_2ranks")
    for path in root.rglob("kernel_details.csv"):
        rows = list(csv.reader(path.open()))
        h = rows[0]
        for row in rows[1:]:
            if row[h.index("Name")].startswith("hcom_allReduce"):
                row[h.index("Name")] = "hcom_allGather__123_0_1"
                row[h.index("Input Shapes")], row[h.index("Input Data Types")] = "64,1024", "DT_BF16"
            elif row[h.index("Name")].startswith(("hcom_send", "hcom_receive")):
                row[h.index("Name")] = "hcom_reduce__9_0_1"
        with path.open("w", newline="") as f:
            csv.writer(f).writerows(rows)
    r = import_ascend(root, MINI.dies)
    nodes = r.doc["nodes"]
    # all-gather: each member's contribution, its input tensor (64 x 1024 bf16)
    assert nodes[3]["attrs"]["comm_type"] == "ALL_GATHER" and nodes[3]["attrs"]["comm_size"] == 131072
    assert nodes[5]["type"] == nodes[9]["type"] == "COMP" and nodes[5]["attrs"]["cmemu.duration_ns"] == 8000.0
    assert any(line.startswith("communication ops 'reduce' cmemu has no collective for") and ": 2 (" in line
               for line in r.unmapped.lines())


def test_zero_length_rows_that_start_together_make_no_cycle(tmp_path):
    root, path = _copy(tmp_path, "msprof_cann601")
    rows = list(csv.reader(path.open()))
    h = rows[0]
    for row in rows[1:]:
        row[h.index("Task Start Time")], row[h.index("Task Duration")] = rows[1][h.index("Task Start Time")], "0"
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    doc = import_ascend(root, MINI.dies).doc
    from cmemu.trace import check_trace

    assert check_trace(doc, "t.json", MINI.dies) == []
    assert doc["nodes"][2]["ctrl_deps"] == [1]  # the later row on stream 6 after the one on stream 5
