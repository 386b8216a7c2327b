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


# --------------------------------------------------------------------- physical overrides, in range


def _numeric_fields():
    import dataclasses

    from cmemu.spec import load_system

    spec = load_system("mini")
    out = [(k, type(getattr(spec, k))) for k in ("nodes", "npus_per_node", "dies_per_npu", "cpus_per_node")]
    for section in ("die", "ub", "d2d", "rdma", "vpc", "comm", "ems"):
        part = getattr(spec, section)
        out += [(f"{section}.{f.name}", type(getattr(part, f.name))) for f in dataclasses.fields(part)
                if f.name != "sources" and type(getattr(part, f.name)) in (int, float)]
    return out


NUMERIC_FIELDS = _numeric_fields()
PINGPONG = TRACES / "examples" / "pingpong.json"


def _value_text(v) -> str:
    if isinstance(v, float):
        return {math.inf: "inf", -math.inf: "-inf"}.get(v, "nan" if v != v else repr(v))
    return str(v)


@pytest.mark.parametrize("override", ["ub.link_rate_gbit_per_s=inf", "ub.link_rate_gbit_per_s=1e30",
                                      "ub.link_rate_gbit_per_s=1e-9", "ub.switch_latency_ns=1e20",
                                      "die.aic_cores=1000", "die.hbm_pin_rate_gbit_per_s=inf",
                                      "die.ai_core_clock_mhz=1e-9", "die.hbm_trefi_ns=1e30", "nodes=100000",
                                      "ub.link_rate_gbit_per_s=nan", "ub.link_latency_ns=-1"])
def test_override_out_of_range_names_the_field_and_the_range(tmp_path, override):
    field = override.split("=")[0]
    for args in (["run", PINGPONG, "-q", "-o", tmp_path / "o.h5"], ["scenario", "run", "ub-p2p", "-s", "mini",
                                                                      "--sizes", "64", "--a2a-dies", "2"],
                 ["topo", "-s", "mini"], ["trace", "validate", PINGPONG]):
        lines = one_line_error(invoke(*args, "--set", override))
        assert field in lines[0] and "must be between" in lines[0], lines
    assert not (tmp_path / "o.h5").exists()


def test_fast_long_link_overflows_no_credit_arithmetic(tmp_path):
    # In range each, together they put more bytes in flight than an int64 product holds.
    lines = one_line_error(invoke("run", PINGPONG, "-q", "-o", tmp_path / "o.h5", "--set", "ub.link_latency_ns=1e9",
                                  "--set", "ub.link_rate_gbit_per_s=1e6"))
    assert "ub.vl_buffer_byte" in lines[0], lines


ANY_NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70),
                       st.sampled_from([0, 1, 2, 255, 256, 2**31, 2**53, 2**63, 1e-3, 1e9, 1e6, 0.5]))


@QUICK
@given(st.lists(st.tuples(st.sampled_from(NUMERIC_FIELDS), ANY_NUMBER, st.floats(0, 1)), min_size=1, max_size=2))
def test_any_numeric_override_runs_or_is_one_line(tmp_path, overrides):
    # Over each field's whole float range, and inside its sane range (a fraction of the way
    # between its ends, on a log scale): the run ends, or fails with one line naming a field.
    from cmemu.spec.common import field_range

    args = []
    for (name, kind), value, frac in overrides:
        lo, hi, _ = field_range(name)
        if frac < 0.5:  # in range
            v = math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * frac * 2)
            value = max(lo, min(hi, round(v))) if kind is int else v
        args += ["--set", f"{name}={_value_text(value)}"]
    out = tmp_path / "o.h5"
    result = invoke("run", PINGPONG, "-q", "-o", out, "--link-bin-ns", "0", "--max-memory", "2GB", *args)
    if result.exit_code != 0:
        one_line_error(result)
        assert not out.exists()
    else:
        out.unlink()


@pytest.mark.parametrize("field", ["ub.write_issue_ns", "ub.read_issue_ns", "comm.aiv_remote_write_startup_ns"])
def test_an_issue_time_past_what_the_engine_holds_is_one_line(tmp_path, field):
    # A packet's issue time and an AIV's start-up are held in 32 bits of ps (2.1 ms) per
    # initiator: 31.6 ms is refused naming the field, not a ValueError from the engine.
    out = tmp_path / "o.h5"
    (line,) = one_line_error(invoke("run", PINGPONG, "-q", "-o", out, "--set", f"{field}=31622776.6"))
    assert field in line and "2,147.484 us" in line
    assert not out.exists()


# ------------------------------------------------------------ validate refuses what run refuses


def validate_and_run(path: Path, tmp_path: Path, *options):
    """`trace validate` and `run` of one file with the same options: (validate's lines, run's line)."""
    v = invoke("trace", "validate", path, *options)
    out = tmp_path / "out.h5"
    r = invoke("run", path, "-q", "-o", out, *options)
    assert not out.exists() and not list(tmp_path.glob(".*tmp*"))
    return one_line_error(v, many_lines=True), one_line_error(r)


def test_validate_lists_every_problem_run_refuses(tmp_path):
    nodes = [
        {"id": 0, "type": "FOO", "rank": 0},
        {"id": 1, "type": "COMP", "rank": 99, "attrs": {"cmemu.duration_ns": 5}},
        comp(2, **{"cmemu.duration_ns": 10, "cmemu.cores": 25}),  # more cores than the die's 24 AIC
        comp(3, **{"cmemu.op": "gemm", "cmemu.m": 64, "cmemu.n": 64, "cmemu.k": 64, "cmemu.tile_m": 1024,
                   "cmemu.tile_n": 1024}),  # a tile whose accumulators do not fit L0C
        {"id": 4, "type": "COMP", "rank": 0, "data_deps": [42], "attrs": {"cmemu.duration_ns": 1}},
        comp(5, num_ops=-1),
    ]
    path = write_trace(tmp_path / "t.json", nodes, **{"cmemu.faults": {"fail": "die:3"}})  # not a list
    lines, (run_line,) = validate_and_run(path, tmp_path)
    expected = [(None, "'cmemu.faults'"), ("node 0", "'type'"), ("node 1", "'rank'"), ("node 2", "'cmemu.cores'"),
                ("node 3", "'cmemu.op'"), ("node 4", "'data_deps'"), ("node 5", "'num_ops'")]
    assert len(lines) == 7, lines
    for line, (node, field) in zip(lines, expected):
        assert line.startswith(f"{path}: {node + ': ' if node else ''}field {field}: "), line
    assert "25 cores requested, the die has 24 AIC cores" in lines[3]
    assert "L0C" in lines[4]
    assert run_line.startswith("cmemu: error: ") and "(and 6 more problems)" in run_line


def test_a_fixed_time_comp_with_too_many_cores_names_the_field(tmp_path):
    # It has no dependencies: "waits for its dependencies" was wrong.
    path = write_trace(tmp_path / "t.json", [comp(0, **{"cmemu.duration_ns": 10, "cmemu.cores": 25})])
    lines, (run_line,) = validate_and_run(path, tmp_path)
    for line in lines + [run_line]:
        assert "node 0: field 'cmemu.cores'" in line and "24 AIC" in line and "waits" not in line, line


@pytest.mark.parametrize("cores, unit", [(256, "aic"), (256, "aiv"), (10**6, "aic")])
def test_cores_beyond_a_byte_are_refused_before_the_engine(tmp_path, cores, unit):
    path = write_trace(tmp_path / "t.json", [comp(0, **{"cmemu.duration_ns": 10, "cmemu.cores": cores,
                                                        "cmemu.unit": unit})])
    lines, (run_line,) = validate_and_run(path, tmp_path)
    assert "field 'cmemu.cores'" in lines[0] and "field 'cmemu.cores'" in run_line


@pytest.mark.parametrize("faults, field, words", [
    (5, "cmemu.faults", "must be a list"),
    (None, "cmemu.faults", "must be a list"),
    ([5], "cmemu.faults[0]", "must be"),
    ([{"fail": 7}], "cmemu.faults[0].fail", "must name a part"),
    ([{"fail": "die:1", "at_ns": -5}], "cmemu.faults[0].at_ns", "at_ns must be a time"),
    ([{"fail": "die:1", "at_ns": 2.0**60}], "cmemu.faults[0].at_ns", "below 2**52"),
    ([{"fail": "die:1", "when": 5}], "cmemu.faults[0]", "unknown key"),
])
def test_fault_schedule_form_is_checked_by_validate(tmp_path, faults, field, words):
    path = write_trace(tmp_path / "t.json", [comp(0)], **{"cmemu.faults": faults})
    lines, (run_line,) = validate_and_run(path, tmp_path)
    assert len(lines) == 1 and f"field '{field}'" in lines[0] and words in lines[0], lines
    assert f"field '{field}'" in run_line


@pytest.mark.parametrize("part, words", [("l2:99.0", "L2 chips are PLANE"), ("die:32", "dies are 0..31"),
                                         ("link:999999", "links"), ("bogus:1", "expected link:ID"),
                                         ("die:\u0663", "whole numbers")])
def test_fault_schedule_parts_are_checked_against_the_system(tmp_path, part, words):
    path = write_trace(tmp_path / "t.json", [comp(0)], **{"cmemu.faults": [{"fail": part, "at_ns": 100}]})
    lines, (run_line,) = validate_and_run(path, tmp_path)
    for line in lines[0], run_line:
        assert f"{path}: header cmemu.faults[0]" in line and words in line and "--fail" not in line, line


def test_a_die_the_trace_fails_is_named_as_the_trace_s(tmp_path):
    nodes = [comp(0, **{"cmemu.duration_ns": 10_000}),
             {"id": 1, "type": "COMM_SEND", "rank": 0, "data_deps": [0], "attrs": {"comm_dst": 1, "comm_size": 10**6}},
             {"id": 2, "type": "COMM_RECV", "rank": 1, "attrs": {"comm_src": 0, "comm_size": 10**6}}]
    path = write_trace(tmp_path / "t.json", nodes, **{"cmemu.faults": [{"fail": "die:1", "at_ns": 5000}]})
    assert invoke("trace", "validate", path).exit_code == 0  # it happens during the run
    (line,) = one_line_error(invoke("run", path, "-q", "-o", tmp_path / "o.h5"))
    assert "die 1" in line and "5.000 us" in line and "the trace's cmemu.faults" in line and "(--fail)" not in line
    # From the start, the ops on it are refused before the run, naming the trace's schedule.
    path = write_trace(tmp_path / "t.json", nodes, **{"cmemu.faults": [{"fail": "die:1"}]})
    lines, (run_line,) = validate_and_run(path, tmp_path)
    for line in lines[0], run_line:
        assert "needs die 1" in line and "cmemu.faults[0], from the start" in line and "--fail" not in line, line


def test_no_path_left_names_where_the_failed_parts_come_from(tmp_path):
    nodes = [{"id": 0, "type": "COMM_SEND", "rank": 0, "attrs": {"comm_dst": 16, "comm_size": 4096}},
             {"id": 1, "type": "COMM_RECV", "rank": 16, "attrs": {"comm_src": 0, "comm_size": 4096}}]
    planes = [f"l1:0.{p}" for p in range(7)]
    path = write_trace(tmp_path / "t.json", nodes, **{"cmemu.faults": [{"fail": p} for p in planes[:4]]})
    args = [a for p in planes[4:] for a in ("--fail", p)]
    (line,) = one_line_error(invoke("run", path, "-q", "-o", tmp_path / "o.h5", *args))
    assert "no path left" in line and "--fail l1:0.4" in line and "cmemu.faults: l1:0.0 from the start" in line


def test_clock_overflow_names_the_file_node_and_field(tmp_path):
    nodes = [comp(0, **{"cmemu.duration_ns": 2**51}), comp(1, **{"cmemu.duration_ns": 2**52}),
             comp(2, **{"cmemu.duration_ns": 2**51})]
    path = write_trace(tmp_path / "t.json", nodes)
    lines, (run_line,) = validate_and_run(path, tmp_path)
    for line in lines[0], run_line:
        assert str(path) in line and "node 1" in line and "'cmemu.duration_ns'" in line and "2**62 ps" in line, line


def test_a_cycle_through_a_million_nodes_is_one_short_line(tmp_path):
    n = 10**6
    path = tmp_path / "cycle.jsonl"
    with path.open("w") as f:
        f.write(json.dumps(HEADER) + "\n")
        f.writelines(f'{{"id":{i},"type":"COMP","rank":0,"data_deps":[{(i + 1) % n}],"attrs":{{"cmemu.duration_ns":1}}}}\n'
                     for i in range(n))
    (line,) = one_line_error(invoke("trace", "validate", path), many_lines=True)
    assert len(line) < 400, len(line)
    assert "0 -> 1 -> 2 -> 3 -> 4 -> ..." in line and "999999 -> 0 (a cycle of 1,000,000 nodes;" in line


def test_a_short_cycle_is_still_shown_whole(tmp_path):
    nodes = [{"id": i, "type": "COMP", "rank": 0, "data_deps": [(i + 1) % 3], "attrs": {"cmemu.duration_ns": 1}}
             for i in range(3)]
    (line,) = one_line_error(invoke("trace", "validate", write_trace(tmp_path / "t.json", nodes)), many_lines=True)
    assert "dependency cycle: 0 -> 1 -> 2 -> 0 (a -> b" in line


@pytest.mark.parametrize("name, words", [("a\u0000b", "NUL"), ("\ud800", "lone surrogate (U+D800)"),
                                         ("ok\udfffx", "lone surrogate (U+DFFF)")])
def test_a_name_that_cannot_be_stored_is_refused_with_its_node(tmp_path, name, words):
    # Refused, not escaped: /ops/name would no longer be the trace's name (and a lone surrogate
    # is not text at all), so the writer should not guess.
    text = json.dumps({**HEADER, "nodes": [{"id": 7, "name": name, "type": "COMP", "rank": 0,
                                            "attrs": {"cmemu.duration_ns": 1}}]})
    path = tmp_path / "t.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    lines, (run_line,) = validate_and_run(path, tmp_path)
    for line in lines[0], run_line:
        assert "node 7: field 'name'" in line and words in line, line


@QUICK
@given(st.text(min_size=1, max_size=12))
def test_any_unicode_name_is_stored_or_refused(tmp_path_factory, name):
    from cmemu.output.reader import open_timeline

    tmp = tmp_path_factory.mktemp("names")
    path = tmp / "t.json"
    doc = {**HEADER, "nodes": [{"id": 0, "name": name, "type": "COMP", "rank": 0, "attrs": {"cmemu.duration_ns": 1}}]}
    path.write_text(json.dumps(doc), encoding="utf-8")
    v = invoke("trace", "validate", path)
    r = invoke("run", path, "-q", "-o", tmp / "o.h5", "--link-bin-ns", "0")
    if v.exit_code:
        assert "field 'name'" in one_line_error(v)[0] and r.exit_code == 2
        return
    assert r.exit_code == 0, r.output
    with open_timeline(tmp / "o.h5") as t:
        assert list(t.columns("ops")["name"]) == [name]


@pytest.mark.parametrize("value", ["1e30", "inf", "nan", "1e-4"])
def test_link_bin_width_beyond_the_clock_is_one_line(tmp_path, value):
    for command in ("run", "validate"):
        args = ["run", PINGPONG, "-q", "-o", tmp_path / "o.h5"] if command == "run" else ["trace", "validate", PINGPONG]
        (line,) = one_line_error(invoke(*args, "--link-bin-ns", value))
        assert "--link-bin-ns" in line, line


# --------------------------------------------------------------------------- memory, bounded


def _rss_grows_by_mb(fn) -> float:
    before = peak_rss_mb()
    fn()
    return peak_rss_mb() - before


@pytest.mark.parametrize("attrs, kind", [
    ({"tensor_size": 2**46}, "MEM_LOAD"), ({"tensor_size": 2**50}, "MEM_LOAD"), ({"tensor_size": 2**53}, "MEM_STORE"),
    ({"num_ops": 2**53, "tensor_size": 2**53}, "COMP"), ({"num_ops": 2**40, "tensor_size": 2**50}, "COMP"),
])
def test_huge_sizes_are_refused_within_the_memory_limit(tmp_path, attrs, kind):
    path = write_trace(tmp_path / "t.json", [{"id": 0, "type": kind, "rank": 0, "attrs": attrs}])
    t0 = time.perf_counter()
    grew = _rss_grows_by_mb(lambda: validate_and_run(path, tmp_path, "--max-memory", "1GB"))
    assert grew < 600 and time.perf_counter() - t0 < 60


def test_a_big_load_fails_cleanly_not_after_gigabytes(tmp_path):
    lines, (run_line,) = validate_and_run(
        write_trace(tmp_path / "t.json", [{"id": 0, "type": "MEM_LOAD", "rank": 0, "attrs": {"tensor_size": 2**46}}]),
        tmp_path, "--max-memory", "1GB")
    for line in lines[0], run_line:
        assert "binned series" in line and "--link-bin-ns" in line and "memory limit of 1.0 GB" in line, line
    # With the bins off the series take nothing, and the run fits.
    assert invoke("trace", "validate", tmp_path / "t.json", "--max-memory", "1GB", "--link-bin-ns", "0").exit_code == 0


def test_moe_with_huge_expert_count_is_refused_on_its_node(tmp_path):
    nodes = [{"id": i, "type": "COMM_COLL", "rank": i, "attrs": {
        "comm_type": "MOE_DISPATCH", "cmemu.group": "g", "cmemu.tokens": 4, "cmemu.top_k": 2, "cmemu.hidden": 64,
        "cmemu.experts": 2**50}} for i in range(2)]
    path = write_trace(tmp_path / "t.json", nodes, groups={"g": [0, 1]})
    lines, (run_line,) = validate_and_run(path, tmp_path, "--max-memory", "2GB")
    assert "node 0: field 'cmemu.experts'" in lines[0] and "1 more node with these attributes" in lines[0]
    assert "node 0: field 'cmemu.experts'" in run_line


def test_tiny_link_bins_are_refused_before_the_run(tmp_path):
    t0 = time.perf_counter()
    (line,) = one_line_error(invoke("run", TRACES / "mini_moe_layer.json", "-q", "-o", tmp_path / "o.h5",
                                    "--link-bin-ns", "1e-3", "--max-memory", "2GB"))
    assert "binned series" in line and "--link-bin-ns" in line and time.perf_counter() - t0 < 60


def test_link_counters_are_checked_between_engine_slices(tmp_path):
    # At 1 ns bins the counters pass the limit during the run: the engine stops there.
    grew = _rss_grows_by_mb(lambda: one_line_error(invoke(
        "run", TRACES / "mini_moe_layer.json", "-q", "-o", tmp_path / "o.h5", "--link-bin-ns", "1",
        "--max-memory", "1500MB")))
    assert grew < 1500


def test_deepseek_generator_refuses_a_step_beyond_memory(tmp_path):
    out = tmp_path / "g.json"
    t0 = time.perf_counter()
    (line,) = one_line_error(invoke("trace", "gen", "deepseek-r1", "--system", "mini", "--layers", "1",
                                    "--tokens-per-die", "100000000", "-o", out))
    assert "--tokens-per-die" in line and "memory limit" in line and not out.exists()
    assert time.perf_counter() - t0 < 20


SIZES = st.one_of(st.integers(0, 2**63), st.sampled_from([2**53, 2**53 + 1, 2**62, 2**63 - 1, 2**40]))


@QUICK
@given(st.sampled_from(["MEM_LOAD", "COMP", "COMM", "MOE"]), SIZES, SIZES)
def test_sizes_up_to_2_63_validate_and_run_or_are_one_line(tmp_path_factory, kind, a, b):
    tmp = tmp_path_factory.mktemp("sizes")
    if kind == "MEM_LOAD":
        nodes = [{"id": 0, "type": "MEM_LOAD", "rank": 0, "attrs": {"tensor_size": a}}]
    elif kind == "COMP":
        nodes = [comp(0, num_ops=a, tensor_size=b)]
    elif kind == "COMM":
        nodes = [{"id": 0, "type": "COMM_SEND", "rank": 0, "attrs": {"comm_dst": 1, "comm_size": a}},
                 {"id": 1, "type": "COMM_RECV", "rank": 1, "attrs": {"comm_src": 0, "comm_size": a}}]
    else:
        nodes = [{"id": i, "type": "COMM_COLL", "rank": i, "attrs": {
            "comm_type": "MOE_DISPATCH", "cmemu.group": "g", "cmemu.tokens": a % 2**20, "cmemu.top_k": 1,
            "cmemu.hidden": 1 + b % 2**16, "cmemu.experts": 1 + b}} for i in range(2)]
    path = write_trace(tmp / "t.json", nodes, groups={"g": [0, 1]})
    v = invoke("trace", "validate", path, "--max-memory", "1GB")
    if v.exit_code:
        one_line_error(v, many_lines=True)
    big = (a > 2**30 and kind == "COMM") or kind == "MOE" and a > 4096
    if v.exit_code == 0 and big:
        return  # valid, and a long run (Ctrl-C stops it): not bad input
    r = invoke("run", path, "-q", "-o", tmp / "o.h5", "--max-memory", "1GB")
    if v.exit_code:
        assert r.exit_code == 2
    if r.exit_code:
        one_line_error(r)


# ---------------------------------------------------------------------------- damaged timelines


def _damage(src: Path, tmp: Path) -> dict:
    import shutil

    import h5py

    out = {}
    data = src.read_bytes()
    for k, frac in enumerate((0.02, 0.05, 0.1, 0.3)):
        b = bytearray(data)
        pos = int(len(b) * frac)
        for i in range(pos, min(len(b), pos + 64)):
            b[i] ^= 0xFF
        (tmp / f"flip{k}.h5").write_bytes(bytes(b))
        out[f"flip{k}"] = tmp / f"flip{k}.h5"
    (tmp / "cut.h5").write_bytes(data[: len(data) // 2])
    out["cut"] = tmp / "cut.h5"
    with h5py.File(tmp / "bare.h5", "w") as f:
        f.attrs["format"], f.attrs["version"] = "cmemu.timeline", 5
    out["bare"] = tmp / "bare.h5"

    def edited(name, fn):
        shutil.copy(src, tmp / f"{name}.h5")
        with h5py.File(tmp / f"{name}.h5", "a") as f:
            fn(f)
        out[name] = tmp / f"{name}.h5"

    edited("spec_json", lambda f: f.attrs.__setitem__("spec_json", "{not json"))
    edited("spec_fields", lambda f: f.attrs.__setitem__("spec_json", json.dumps({"nodes": 2})))

    def short(f):
        e = f["ops/end_ps"][()]
        del f["ops/end_ps"]
        f["ops/end_ps"] = e[:-3]

    edited("short_end", short)
    edited("no_end", lambda f: f.attrs.__delitem__("sim_end_ps"))

    def bad_rank(f):
        r = f["ops/rank"][()]
        r[0] = 10**6
        f["ops/rank"][...] = r

    edited("rank", bad_rank)

    def far_bin(f):
        b = f["links/binned/bin"][()]
        b[0] = 2**31 - 1
        f["links/binned/bin"][...] = b

    edited("far_bin", far_bin)
    edited("bin_ps", lambda f: f["links/binned"].attrs.__setitem__("bin_ps", 0))
    return out


@pytest.fixture(scope="module")
def damaged(tiny_timeline, tmp_path_factory):
    return _damage(tiny_timeline, tmp_path_factory.mktemp("damaged"))


READERS = ["report", "report --json", "report --plots", "export perfetto"]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("damage", ["flip0", "flip1", "flip2", "flip3", "cut", "bare", "spec_json", "spec_fields",
                                    "short_end", "no_end", "rank", "far_bin", "bin_ps"])
def test_damaged_timeline_is_one_line_in_every_reader(damaged, tmp_path, reader, damage):
    path = damaged[damage]
    args = {"report": ["report", path], "report --json": ["report", path, "--json"],
            "report --plots": ["report", path, "--plots", tmp_path / "p"],
            "export perfetto": ["export", "perfetto", path, "-o", tmp_path / "x.json.gz"]}[reader]
    result = invoke(*args)
    if result.exit_code == 0:
        # Bytes no reader reads, or a group this reader does not use (the table has no time axis).
        assert damage.startswith("flip") or (damage == "far_bin" and "--plots" not in reader
                                             and "export" not in reader), result.output
        return
    (line,) = one_line_error(result)
    assert str(path) in line, line
    assert not (tmp_path / "x.json.gz").exists()


@pytest.mark.parametrize("damage", ["bare", "spec_json", "spec_fields", "short_end", "no_end", "bin_ps"])
def test_open_timeline_refuses_a_damaged_file(damaged, damage):
    from cmemu import open_timeline
    from cmemu.output.reader import TimelineError

    with pytest.raises(TimelineError, match="a damaged timeline") as info:
        open_timeline(damaged[damage])
    assert "\n" not in str(info.value)


def test_open_timeline_refuses_rows_that_point_outside(damaged):
    from cmemu import open_timeline
    from cmemu.output.reader import TimelineError

    for damage, group in (("rank", "ops"), ("far_bin", "links/binned")):
        with open_timeline(damaged[damage]) as t, pytest.raises(TimelineError, match="outside"):
            t.columns(group)


def test_plots_merge_bins_beyond_what_a_plot_shows(tmp_path):
    from cmemu.output.report import MAX_PLOT_BINS, _plot_bins
    from cmemu.run import run_trace

    assert _plot_bins(10) == (10, 1) and _plot_bins(MAX_PLOT_BINS) == (MAX_PLOT_BINS, 1)
    cols, per = _plot_bins(2**31)
    assert cols <= MAX_PLOT_BINS and cols * per >= 2**31
    # A timeline of 1 ns bins (tens of thousands of them) plots in a few columns per bin.
    path = tmp_path / "fine.h5"
    run_trace(PINGPONG, output=path, progress=False, link_bin_ns=1)
    result = invoke("report", path, "--plots", tmp_path / "p")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p" / "links.png").is_file() and (tmp_path / "p" / "hbm.png").is_file()


@pytest.mark.parametrize("option", ["--sizes", "--a2a-bytes"])
@pytest.mark.parametrize("value", ["99999999999999999999", "9999999999G", "٣"])
def test_scenario_sizes_beyond_a_trace_s_are_one_line(option, value):
    args = ["scenario", "run", "ub-p2p", "-s", "mini", "--a2a-dies", "2", "--sizes", "64", option, value]
    (line,) = one_line_error(invoke(*args))
    assert "size" in line, line


@pytest.mark.parametrize("kind", ["MOE_DISPATCH", "MOE_COMBINE"])
def test_a_moe_collective_of_no_tokens_runs(tmp_path, kind):
    # A fused kernel whose AIVs have nothing to send: its loops are empty, and it still ends.
    nodes = [{"id": i, "type": "COMM_COLL", "rank": i, "attrs": {
        "comm_type": kind, "cmemu.group": "g", "cmemu.tokens": 0, "cmemu.top_k": 1, "cmemu.hidden": 1,
        "cmemu.experts": 2}} for i in range(2)]
    path = write_trace(tmp_path / "t.json", nodes, groups={"g": [0, 1]})
    r = invoke("run", path, "-q", "-o", tmp_path / "o.h5")
    assert r.exit_code == 0, r.output
