"""`cmemu report`: the summary table of the shipped trace's timeline, and its PNG plots."""
import dataclasses
import json

import pytest

from cmemu.errors import CmemuError
from cmemu.output import hdf5
from cmemu.output.reader import open_timeline
from cmemu.output.report import parse_dies, run_report
from cmemu.run import run_trace
from conftest import TRACES
from test_timeline import TINY, with_records

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) from the PNG header."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG, path
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    path = tmp_path_factory.mktemp("rp") / "layer.h5"
    run_trace(TRACES / "mini_moe_layer.json", output=path, progress=False)
    return path


def test_report_on_shipped_trace_writes_table_and_plots(shipped, tmp_path, cli):
    plots = tmp_path / "plots"
    proc = cli("report", shipped, "--plots", plots, "--window", "100:300", "--dies", "0-1,17")
    out = proc.stdout
    with open_timeline(shipped) as t:
        makespan_us = t.sim_end_ps / 1e6
    assert f"makespan             {makespan_us:,.3f} us" in out
    for words in ("exposed comm", "UB links", "HBM", "time per op type", "COMP", "COMM_RECV",
                  "ten busiest links", "ub_die_to_l1"):
        assert words in out, words
    busiest = out.split("ten busiest links\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(busiest) == 2 + 10  # header, rule, ten links
    for name in ("gantt.png", "links.png", "op_types.png", "hbm.png"):
        w, h = png_size(plots / name)
        assert w > 400 and h > 200, name
        assert f"plot  {plots / name}" in out
    assert "HBM bandwidth over time: not plotted" not in out


def test_report_json_and_link_heat_map(tmp_path, capsys):
    """A timeline with pipe tasks and binned link counters: the heat map and pipe lanes are drawn."""
    r = dataclasses.replace(run_trace(TINY, progress=False), tasks=None, link_series=None)
    path = hdf5.write_timeline(tmp_path / "tiny.h5", with_records(r))
    lines = []
    written = run_report(path, plots_dir=tmp_path / "p", as_json=True, dies="0,2", echo=lines.append)
    s = json.loads(lines[0])
    assert s["link_bins"] == "recorded" and s["tasks"] == "recorded"
    assert s["op_types"]["COMP"]["count"] == 4 and len(s["busiest_links"]) <= 10
    # The synthetic tasks put each COMP op on two CUBE cores at once: 2 x 1850 ns of CUBE time on
    # dies 0, 2, 3 (1000, 750 and 100 ns of COMP), but the pipe is active only 1850 ns in all.
    cube = s["pipes"]["CUBE"]
    assert cube["tasks"] == 8 and cube["dies"] == 3
    assert cube["total_time_us"] == pytest.approx(2 * 1.85)
    assert cube["busy_per_die_mean_percent"] == pytest.approx(100 * 1.85 / 3 / s["makespan_us"])
    assert s["pipes"]["SDMA"]["tasks"] == 3
    assert [p.name for p in written] == ["gantt.png", "links.png", "op_types.png", "hbm.png"]
    for p in written:
        png_size(p)


def test_report_without_binned_counters_plots_link_totals(tmp_path):
    """No /links/binned: links.png shows per-link utilisation over the run instead of a heat map."""
    r = dataclasses.replace(run_trace(TINY, progress=False), tasks=None, link_series=None, hbm_series=None)
    path = hdf5.write_timeline(tmp_path / "tiny.h5", r)
    lines = []
    written = run_report(path, plots_dir=tmp_path / "p", echo=lines.append)
    text = "\n".join(lines)
    assert "link time series     not recorded" in text and "no cube/vector utilisation" in text
    assert [p.name for p in written] == ["gantt.png", "links.png", "op_types.png"]
    assert "HBM bandwidth over time: not plotted" in text  # no bins were recorded
    w, h = png_size(tmp_path / "p" / "links.png")
    assert w > 400 and h > 200


def test_report_reads_a_v1_timeline(cli, tmp_path):
    from test_timeline import TINY_V1

    proc = cli("report", TINY_V1, "--plots", tmp_path / "p")
    assert "timeline v1" in proc.stdout and "layout version 1 has no /tasks" in proc.stdout
    assert (tmp_path / "p" / "gantt.png").is_file()


def test_report_bad_options_exit_2(shipped, cli):
    proc = cli("report", shipped, "--dies", "99", check=False)
    assert proc.returncode == 2 and "dies are numbered 0 to 31" in proc.stderr
    proc = cli("report", shipped, "--window", "9:1", check=False)
    assert proc.returncode == 2 and "--window" in proc.stderr


def test_parse_dies():
    assert parse_dies(None, 32) == [0, 1, 2, 3]
    assert parse_dies(None, 2) == [0, 1]
    assert parse_dies("0-2,16,1", 32) == [0, 1, 2, 16]
    with pytest.raises(CmemuError, match="--dies"):
        parse_dies("x", 32)
