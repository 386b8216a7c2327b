"""Hostile and careless input that used to break cmemu: ranges expanded before they were checked,
numbers beyond what the integer clock holds, sizes that grow memory without bound, damaged
files. Each must end in exit status 2 and one line a user can act on (``cmemu trace validate``:
one line per problem), quickly, within bounded memory, and leave no output behind.

Everything runs on ``mini`` with tiny traces; the hypothesis tests keep their examples few.
"""
from __future__ import annotations

import json
import math
import resource
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmemu.cli import main
from cmemu.errors import CmemuError
from conftest import TRACES

QUICK = settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.function_scoped_fixture])
HEADER = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini"}


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(result, many_lines=False) -> list[str]:
    """Exit status 2, no exception escaped, one line (or one per problem), each short."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert lines and all(line.strip() for line in lines), result.stderr
    if not many_lines:
        assert len(lines) == 1, result.stderr
    assert all(len(line) < 2000 for line in lines), "a line too long to read"
    return lines


def write_trace(path: Path, nodes, **header) -> Path:
    path.write_text(json.dumps({**HEADER, **header, "nodes": nodes}))
    return path


def comp(i, rank=0, **attrs):
    return {"id": i, "type": "COMP", "rank": rank, "attrs": attrs or {"cmemu.duration_ns": 10}}


@pytest.fixture(scope="module")
def tiny_timeline(tmp_path_factory):
    """A small timeline of the pingpong example (mini), for the readers."""
    from cmemu.run import run_trace

    path = tmp_path_factory.mktemp("tl") / "pingpong.h5"
    run_trace(TRACES / "examples" / "pingpong.json", output=path, progress=False)
    return path


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------------------ ranges, checked first


@pytest.mark.parametrize("dies", ["0-1000000000", "0-99999999999999999999", "5-3", "31-32", "0-31,1000000000"])
def test_dies_range_is_checked_before_it_is_expanded(tiny_timeline, tmp_path, dies):
    before = peak_rss_mb()
    t0 = time.perf_counter()
    lines = one_line_error(invoke("report", tiny_timeline, "--plots", tmp_path / "p", "--dies", dies))
    assert "--dies" in lines[0] and "0 to 31" in lines[0], lines
    assert time.perf_counter() - t0 < 10 and peak_rss_mb() - before < 200
    assert not (tmp_path / "p").exists() or not list((tmp_path / "p").iterdir())


def test_dies_range_within_the_system_still_works():
    from cmemu.output.report import parse_dies

    assert parse_dies("0-3,16,2", 32) == [0, 1, 2, 3, 16]
    assert parse_dies("31-31", 32) == [31]


@pytest.mark.parametrize("window", ["1e400:1e401", "inf:inf", "0:inf", "nan:1", "0:nan", "1e300:1e301",
                                    "-0:1e30", "0:99999999999999999999"])
@pytest.mark.parametrize("command", ["report", "export"])
def test_window_beyond_the_clock_is_one_line(tiny_timeline, tmp_path, window, command):
    if command == "report":
        result = invoke("report", tiny_timeline, "--window", window)
    else:
        result = invoke("export", "perfetto", tiny_timeline, "-o", tmp_path / "x.json.gz", "--window", window)
    lines = one_line_error(result)
    assert "--window" in lines[0], lines
    assert not (tmp_path / "x.json.gz").exists()


def test_window_within_the_clock_still_works():
    from cmemu.output.perfetto import parse_window

    assert parse_window("100:250.5") == (100_000_000, 250_500_000)
    assert parse_window("0:1e6") == (0, 10**12)


def sweep_file(tmp_path, grid: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text('scenario = "ub-p2p"\n[grid]\n' + grid + "\n")
    return path


@pytest.mark.parametrize("grid", [
    "'ub.link_rate_gbit_per_s' = {start = 0.0, stop = 1e308, step = 1e-308}",
    "'ub.link_rate_gbit_per_s' = {start = 5e-324, stop = 1e308, factor = 2}",
    "'ub.link_rate_gbit_per_s' = {start = 1e-300, stop = 1e300, factor = 1.0000000001}",
    "'ub.link_rate_gbit_per_s' = {start = 0, stop = 9223372036854775807, step = 1}",
    "'ub.link_rate_gbit_per_s' = {start = -1e308, stop = 1e308, step = 1}",
])
def test_sweep_ranges_that_overflow_are_counted_before_they_are_built(tmp_path, grid):
    before = peak_rss_mb()
    t0 = time.perf_counter()
    lines = one_line_error(invoke("sweep", sweep_file(tmp_path, grid), "--dry-run"))
    assert "s.toml" in lines[0] and "ub.link_rate_gbit_per_s" in lines[0], lines
    assert "values" in lines[0] or "points" in lines[0], lines
    assert time.perf_counter() - t0 < 10 and peak_rss_mb() - before < 200


def test_sweep_grid_product_is_counted_before_it_is_built(tmp_path):
    grid = "\n".join(f"'ub.{k}' = {{start = 1, stop = 100, step = 1}}" for k in
                     ("link_rate_gbit_per_s", "link_latency_ns", "switch_latency_ns"))
    lines = one_line_error(invoke("sweep", sweep_file(tmp_path, grid), "--dry-run"))
    assert "1,000,000 points" in lines[0], lines


@pytest.mark.parametrize("data", [b"\xff\xfe\x00\x00binary\x80\x81", bytes(range(256)), b"scenario = '\xc3\x28'"])
def test_binary_sweep_file_is_one_line(tmp_path, data):
    path = tmp_path / "s.toml"
    path.write_bytes(data)
    lines = one_line_error(invoke("sweep", path, "--dry-run"))
    assert str(path) in lines[0] and "UTF-8" in lines[0], lines


# ------------------------------------------------------------------- work bounded before it is built


BIG_OPS = [
    {"cmemu.op": "gemm", "cmemu.m": 2**40, "cmemu.n": 2**40, "cmemu.k": 2**40},
    {"cmemu.op": "gemm", "cmemu.m": 16, "cmemu.n": 16, "cmemu.k": 2**53},
    {"cmemu.op": "grouped_gemm", "cmemu.m": 2**20, "cmemu.n": 2**20, "cmemu.k": 2**20, "cmemu.groups": 2**20},
    {"cmemu.op": "mla_prefill_attention", "cmemu.tokens": 2**50, "cmemu.kv_len": 2**53},
    {"cmemu.op": "mla_prefill", "cmemu.tokens": 2**53},
    {"cmemu.op": "mla_decode", "cmemu.tokens": 2**40, "cmemu.kv_len": 2**40},
    {"cmemu.op": "rmsnorm", "cmemu.rows": 2**53, "cmemu.cols": 2**53},
]


@pytest.mark.parametrize("attrs", BIG_OPS, ids=lambda a: a["cmemu.op"])
def test_huge_op_is_refused_before_its_schedule_is_built(attrs):
    from cmemu.die.ops import node_cost
    from cmemu.spec import load_system

    die = load_system("mini").die
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="pipe instructions"):
        node_cost(die, {"cmemu.dtype": "bf16", **attrs})
    assert time.perf_counter() - t0 < 5


def test_gemm_instruction_count_is_the_schedule_s():
    # The count is worked out without a loop over the k-chunks; it is the one the program fills.
    from cmemu.die.gemm import gemm_instructions, plan
    from cmemu.die.model import DieModel
    from cmemu.spec import load_system

    model = DieModel.of(load_system("mini").die)
    for m, n, k, groups, dtype in [(1, 1, 1, 1, "bf16"), (128, 152, 7168, 1, "int8"), (300, 2000, 12345, 3, "bf16"),
                                   (4096, 7168, 2048, 1, "bf16"), (8, 256, 7168, 1, "int8")]:
        t = plan(model, m, n, k, groups, dtype)
        steps = sum(-(-min(t.kl1, t.k - q * t.kl1) // t.bk) for q in range(t.chunks))
        assert gemm_instructions(t) == t.tiles * (4 * t.chunks + 2 * steps + 1)
