"""`cmemu sweep`: expanding sweep files into points, their keys, the errors a bad file gets, and
sweeps run on Dask clusters of 2 worker processes (a failing point is recorded while the others
finish; a re-run skips finished points; every cluster is closed at the end).

The tiny points are ub-p2p on `mini`, 512 B writes, no all-to-all: about 0.3 s each.
"""
import csv
import json
import shutil

import h5py
import psutil
import pytest

import cmemu
from cmemu.sweep import SweepFileError, load_sweep, read_summary, run_sweep
from conftest import REPO, TRACES

TINY = """\
description = "UB write bandwidth on mini at three link rates, one of them invalid"
scenario = "ub-p2p"
system = "mini"

[options]
sizes = "512"
a2a_dies = 0
op = "write"

[grid]
ub.link_rate_gbit_per_s = [112, 224, -1]
"""


def write(tmp_path, text, name="sweep.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def children():
    """Our child processes, but for multiprocessing's resource tracker (started on first use of
    multiprocessing, it stays for the life of this process by design)."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())}


# -- expanding a sweep file ---------------------------------------------------------------------

def test_grid_is_a_product_and_zip_goes_together(tmp_path):
    sw = load_sweep(write(tmp_path, """
scenario = "ub-p2p"
[options]
sizes = "512"
[grid]
system = ["mini", "cloudmatrix384-192"]
"ub.switch_latency_ns" = {start = 100, stop = 300, step = 100}
[[zip]]
a2a_dies = [8, 16]
a2a-bytes = ["1K", "2K"]
"""))
    assert len(sw.points) == 2 * 3 * 2
    first = sw.points[0]
    assert first.parameters == {"system": "mini", "ub.switch_latency_ns": 100, "a2a_dies": 8, "a2a-bytes": "1K"}
    assert first.config["overrides"] == {"ub.switch_latency_ns": 100}
    assert first.config["options"] == {"sizes": "512", "ops": "both", "a2a_dies": 8, "a2a_bytes": "1K"}
    pairs = {(p.config["options"]["a2a_dies"], p.config["options"]["a2a_bytes"]) for p in sw.points}
    assert pairs == {(8, "1K"), (16, "2K")}
    assert sw.points[-1].parameters["system"] == "cloudmatrix384-192"  # the first key varies slowest
    assert len({p.key for p in sw.points}) == len(sw.points)


def test_ranges_include_stop_and_floats_stay_tidy(tmp_path):
    sw = load_sweep(write(tmp_path, """
scenario = "ub-p2p"
[grid]
ub.link_rate_gbit_per_s = {start = 0.1, stop = 0.5, step = 0.1}
a2a_bytes = {start = 1024, stop = 8192, factor = 2}
"""))
    rates = sorted({p.config["overrides"]["ub.link_rate_gbit_per_s"] for p in sw.points})
    assert rates == [0.1, 0.2, 0.3, 0.4, 0.5]
    sizes = [p.config["options"]["a2a_bytes"] for p in sw.points[:4]]
    assert sizes == ["1024", "2048", "4096", "8192"]  # converted as the --a2a-bytes option converts


def test_key_is_the_resolved_configuration(tmp_path, monkeypatch):
    base = load_sweep(write(tmp_path, TINY)).points
    assert [p.key for p in load_sweep(write(tmp_path, TINY, "again.toml")).points] == [p.key for p in base]
    # The same point written another way (the option's flag name, a quoted path, the default
    # written out) is the same configuration.
    other = TINY.replace('op = "write"', 'ops = "write"\na2a_bytes = "16K"').replace(
        "ub.link_rate_gbit_per_s", '"ub.link_rate_gbit_per_s"')
    assert [p.key for p in load_sweep(write(tmp_path, other, "other.toml")).points] == [p.key for p in base]
    changed = load_sweep(write(tmp_path, TINY.replace('sizes = "512"', 'sizes = "1K"'), "c.toml")).points
    assert not {p.key for p in changed} & {p.key for p in base}
    monkeypatch.setattr(cmemu, "__version__", "0.0.0-other")
    assert not {p.key for p in load_sweep(write(tmp_path, TINY, "v.toml")).points} & {p.key for p in base}


def test_trace_sweep_keys_follow_the_trace_content(tmp_path):
    trace = tmp_path / "t.json"
    shutil.copy(TRACES / "examples" / "pingpong.json", trace)
    text = 'trace = "t.json"\n[grid]\nub.link_rate_gbit_per_s = [112, 224]\n'
    keys = [p.key for p in load_sweep(write(tmp_path, text)).points]
    trace.write_text(trace.read_text().replace("1048576", "524288"))
    assert not set(keys) & {p.key for p in load_sweep(write(tmp_path, text)).points}


@pytest.mark.parametrize("text, where", [
    ('scenario = "ub-p2p"\n[grid]\nub.link_rate_gbit_pers = [1, 2]\n', "grid.ub.link_rate_gbit_pers"),
    ('scenario = "ub-p2p"\n[grid]\nfoo = [1, 2]\n', "grid.foo"),
    ('scenario = "no-such"\n', "scenario"),
    ('scenario = "ub-p2p"\ntrace = "x.json"\n', "scenario"),
    ('description = "neither"\n', "scenario"),
    ('generator = "no-such-model"\n', "generator"),
    ('generator = "deepseek-r1"\n[grid]\ntokens_per_die = [0, 96]\n', "grid.tokens_per_die"),
    ('generator = "deepseek-r1"\n[options]\nbatch = 4\n', "options.batch"),
    ('trace = "missing.json"\n', "trace"),
    ('scenario = "ub-p2p"\n[grid]\nsystem = ["mini", "cm999"]\n', "grid.system"),
    ('scenario = "ub-p2p"\nsystem = "mini"\n[grid]\nsystem = ["mini"]\n', "system"),
    ('scenario = "ub-p2p"\n[grid]\na2a_dies = 5\n', "grid.a2a_dies"),
    ('scenario = "ub-p2p"\n[grid]\na2a_dies = []\n', "grid.a2a_dies"),
    ('scenario = "ub-p2p"\n[grid]\na2a_dies = [2, 2]\n', "grid.a2a_dies"),
    ('scenario = "ub-p2p"\n[grid]\na2a_dies = {start = 2, stop = 8}\n', "grid.a2a_dies"),
    ('scenario = "ub-p2p"\n[grid]\na2a_dies = {start = 2, stop = 8, step = -2}\n', "grid.a2a_dies.step"),
    ('scenario = "ub-p2p"\n[grid]\na2a_dies = {start = 2, stop = 8, by = 2}\n', "grid.a2a_dies"),
    ('scenario = "ub-p2p"\n[grid]\na2a_dies = ["x"]\n', "grid.a2a_dies"),
    ('scenario = "ub-p2p"\n[grid]\nop = ["write", "sideways"]\n', "grid.op"),
    ('scenario = "ub-p2p"\n[[zip]]\na2a_dies = [2, 4]\na2a_bytes = ["1K"]\n', "zip[0]"),
    ('scenario = "ub-p2p"\n[options]\na2a_dies = 2\n[grid]\na2a_dies = [2, 4]\n', "options.a2a_dies"),
    ('scenario = "ub-p2p"\n[grid]\na2a_dies = [2, 4]\n[[zip]]\na2a-dies = [2, 4]\n', "zip[0].a2a-dies"),
    ('scenario = "ub-p2p"\n[set]\nub.nope = 1\n', "set.ub.nope"),
    ('scenario = "ub-p2p"\n[options]\nnope = 1\n', "options.nope"),
    ('scenario = "ub-p2p"\nbogus = 1\n', "bogus"),
    ('scenario = "ub-p2p"\n[summary]\ntables = "all-to-all"\n', "summary.tables"),
    ('scenario = "ub-p2p"\n[grid\n', "not valid TOML"),
])
def test_sweep_file_errors_name_the_key(tmp_path, text, where):
    path = write(tmp_path, text)
    with pytest.raises(SweepFileError) as err:
        load_sweep(path)
    message = str(err.value)
    assert message.startswith(f"{path}: {where}") or where in message
    assert "\n" not in message


def test_bad_sweep_file_is_one_line_and_exit_2(cli, tmp_path):
    path = write(tmp_path, 'scenario = "ub-p2p"\n[grid]\nub.no_such_field = [1, 2]\n')
    proc = cli("sweep", path, "-o", tmp_path / "out", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"cmemu: error: {path}: grid.ub.no_such_field: no spec field 'ub.no_such_field' (see the [ub] table of a preset)"
    ]
    assert not (tmp_path / "out").exists()


def test_documented_example_loads(tmp_path):
    doc = (REPO / "docs" / "sweep-format.md").read_text()
    example = doc.split("## A complete example")[1].split("```toml\n")[1].split("```")[0]
    sw = load_sweep(write(tmp_path, example))
    assert len(sw.points) == 16  # as the page says
    assert sw.tables == ("all-to-all",)
    assert all(p.config["overrides"]["ub.load_balancing"] == "spray" for p in sw.points)


def test_shipped_example_sweeps_run(tmp_path):
    """Each shipped sweep loads (its options are checked against the commands'), and the first
    (smallest) point of each scenario sweep runs, in this process: the examples cannot rot
    silently when a scenario changes. (A generator sweep's first point takes 10 s or more on the
    full system; generator sweeps are run on `mini` below.)"""
    from cmemu.sweep.point import run_point

    paths = sorted((REPO / "traces" / "sweeps").glob("*.toml"))
    assert len(paths) >= 4
    for path in paths:
        sw = load_sweep(path)
        assert sw.points and sw.description
        if sw.kind == "generator":
            continue
        first = sw.points[0]
        out = run_point(first.config, first.trace_path, str(tmp_path))
        assert out["status"] == "ok", (path.name, out.get("error"))
        assert all(out["tables"].values()), path.name


# -- running ------------------------------------------------------------------------------------

def test_sweep_on_a_local_cluster_records_failures_and_reruns_skip(tmp_path, cli):
    path = write(tmp_path, TINY)
    out = tmp_path / "out"
    before = children()
    r = run_sweep(path, out, workers=2, progress=False)
    assert children() == before, "the local cluster's worker processes must be gone"
    assert (r.ran, r.skipped, r.workers) == (3, 0, 2)
    ok112, ok224, bad = (p.key for p in r.sweep.points)
    assert r.failed == [bad]

    for key in (ok112, ok224):
        folder = out / "points" / key
        assert json.loads((folder / "config.json").read_text())["config"]["scenario"] == "ub-p2p"
        assert json.loads((folder / "results.json").read_text())["status"] == "ok"
        assert not (folder / "error.json").exists()
    error = json.loads((out / "points" / bad / "error.json").read_text())
    assert error["error_type"] == "SpecError" and "ub.link_rate_gbit_per_s" in error["error"]
    assert not (out / "points" / bad / "results.json").exists()

    with open(out / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["point"] for r in rows} == {ok112, ok224, bad}
    failed = [row for row in rows if row["status"] == "failed"]
    assert len(failed) == 1 and "must be between" in failed[0]["error"]
    bw = {}
    for row in rows:
        if row["status"] == "ok" and row["path"] == "NPU->NPU":
            bw.setdefault(int(row["ub.link_rate_gbit_per_s"]), []).append(float(row["bandwidth_gbyte_per_s"]))
    assert set(bw) == {112, 224}
    assert max(bw[112]) < min(bw[224])  # a faster link carries more, in every path
    table = read_summary(out / "summary.h5")  # a DataFrame with pandas, else a dict of arrays
    columns = list(table.columns) if hasattr(table, "columns") else list(table)
    assert columns == list(rows[0])
    assert len(table[columns[0]]) == len(rows)
    with h5py.File(out / "summary.h5") as f:
        assert f.attrs["failed"] == 1 and "ub-p2p" in f.attrs["sweep_toml"]

    # The command line on the same folder: the two finished points are skipped, the failed one
    # runs again and fails again; one error line, exit status 2.
    stamp = (out / "points" / ok112 / "results.json").stat().st_mtime_ns
    proc = cli("sweep", path, "-o", out, "--workers", "2", check=False)
    assert proc.returncode == 2
    assert "2 skipped (finished before)" in proc.stdout and "1 failed" in proc.stdout
    assert "failed points" in proc.stdout and "NPU->NPU" in proc.stdout
    assert proc.stderr.strip().splitlines() == [
        f"cmemu: error: 1 of 3 points failed, e.g. {bad}: {error['error']}"
    ]
    assert (out / "points" / ok112 / "results.json").stat().st_mtime_ns == stamp


def run_point_dying_at_112(config, trace_path, folder):
    """run_point, but the worker process dies under the point at 112 Gb/s (as in a crash)."""
    import os

    from cmemu.sweep.point import run_point

    if config["overrides"].get("ub.link_rate_gbit_per_s") == 112:
        os._exit(3)
    return run_point(config, trace_path, folder)


def test_a_point_whose_worker_dies_is_recorded_and_the_others_finish(tmp_path, monkeypatch):
    import cmemu.sweep.point

    # The workers import this module to find the function: put the tests folder on their path.
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))
    monkeypatch.setattr(cmemu.sweep.point, "run_point", run_point_dying_at_112)
    before = children()
    r = run_sweep(write(tmp_path, TINY), tmp_path / "out", workers=2, progress=False)
    assert children() == before
    dies, ok, bad = (p.key for p in r.sweep.points)
    assert sorted(r.failed) == sorted([dies, bad])
    error = json.loads((tmp_path / "out" / "points" / dies / "error.json").read_text())
    assert "worker process died" in error["error"] and error["error_type"] == "KilledWorker"
    assert (tmp_path / "out" / "points" / ok / "results.json").is_file()


@pytest.fixture(scope="module")
def scheduler():
    """A cluster started outside cmemu, reached by its address (as `--scheduler` does)."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


def test_trace_sweep_on_a_scheduler_writes_timelines(tmp_path, scheduler):
    shutil.copy(TRACES / "examples" / "pingpong.json", tmp_path / "pingpong.json")
    path = write(tmp_path, """
trace = "pingpong.json"
[options]
detail = "ops"
[grid]
d2d.rate_gbyte_per_s = [100, 200]
""")
    r = run_sweep(path, tmp_path / "out", scheduler=scheduler, progress=False)
    assert (r.ran, r.failed) == (2, [])
    for p in r.sweep.points:
        with cmemu.open_timeline(tmp_path / "out" / "points" / p.key / "timeline.h5") as t:
            assert t.attrs["preset"] == "mini"
    by_rate = {row["d2d.rate_gbyte_per_s"]: row for row in r.rows}
    assert by_rate[100]["system"] == "mini"  # the trace header's system
    # Ranks 0 and 1 are the two dies of one NPU: the 1 MiB send crosses the die-to-die link.
    assert by_rate[100]["makespan_us"] > by_rate[200]["makespan_us"]
    again = run_sweep(path, tmp_path / "out", scheduler=scheduler, progress=False)
    assert (again.ran, again.skipped) == (0, 2)


def test_generator_sweep_generates_replays_and_drops_the_trace(tmp_path, scheduler):
    path = write(tmp_path, """
generator = "deepseek-r1"
system = "mini"
[options]
layers = 1
detail = "ops"
[grid]
tokens_per_die = [16, 64]
""")
    sw = load_sweep(path)
    assert sw.points[0].config["generator"] == "deepseek-r1"
    assert sw.points[0].config["options"]["kv_len"] == 4096  # the generator's default, in the key
    r = run_sweep(sw, tmp_path / "out", scheduler=scheduler, progress=False)
    assert (r.ran, r.failed) == (2, [])
    for p in sw.points:
        folder = tmp_path / "out" / "points" / p.key
        assert sorted(f.name for f in folder.iterdir()) == ["config.json", "results.json", "timeline.h5"]
    by_tokens = {row["tokens_per_die"]: row for row in r.rows}
    assert by_tokens[16]["system"] == "mini"
    assert by_tokens[64]["makespan_us"] > by_tokens[16]["makespan_us"]  # four times the tokens per die


def test_unreachable_scheduler_is_one_error(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT", "2s")  # Dask's own setting
    proc = cli("sweep", write(tmp_path, TINY), "-o", tmp_path / "out", "--scheduler", "tcp://127.0.0.1:9", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cmemu: error: cannot reach the Dask scheduler at tcp://127.0.0.1:9")


@pytest.mark.parametrize("text, kept", [
    ('{"status": "ok", "parameters": {}, "tables": {"t": [{"a": 1}]}}', True),
    ('{"status": "ok"}', False),  # before, a KeyError in the summary
    ('{"status": "ok", "tables": []}', False),  # before, an AttributeError
    ('{"status": "ok", "tables": {"t": [1, 2]}}', False),
    ('{"status": "ok", "tables": {"t": []}, "parameters": []}', False),
    ('{"status": "failed", "tables": {}}', False),
    ("not json", False),
])
def test_a_damaged_results_file_makes_its_point_run_again(text, kept, tmp_path):
    from cmemu.sweep import _load_results

    path = tmp_path / "results.json"
    path.write_text(text)
    assert (_load_results(path) is not None) == kept
