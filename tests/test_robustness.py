"""Bad input through the command line: random bytes, truncated JSON, wrong types, huge numbers,
NaN, deep nesting, a million nodes. Each gives exit status 2 and one clear line (for
`cmemu trace validate`: one line per problem), never a traceback or a hang; `cmemu run` leaves no
output file. Most cases run the command in-process (click's runner) so that hypothesis can try
many; the deep-nesting and million-node cases run the real command in a subprocess.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cmemu.cli import main
from test_property import valid_traces

BASE = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
HEADER = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": "mini"}


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_clean_error(result, many_lines=False):
    """Exit status 2, no exception escaped, no traceback; one line (or one per problem)."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert lines and all(line.strip() for line in lines), result.stderr
    if not many_lines:
        assert len(lines) == 1, result.stderr
    assert all(len(line) < 2000 for line in lines), "a line too long to read"
    return lines


# A valid trace with a petabyte message is a long run (Ctrl-C stops it), not bad input.
LONG_RUN_BYTES = 2**30


def _message_bytes(path: Path) -> int:
    from cmemu.trace import load_trace

    trace = load_trace(path, num_ranks=32)
    return sum(n.attrs["comm_size"] for n in trace.nodes if n.type == "COMM_SEND")


def check_both_commands(path: Path, out: Path) -> int:
    """Validate and run one file: both end cleanly, and what validate refuses, run refuses.

    Returns the exit status of `trace validate`.
    """
    v = invoke("trace", "validate", path)
    if v.exit_code == 0:
        assert v.stdout.startswith("ok: ") and len(v.stdout.splitlines()) == 1
        if _message_bytes(path) > LONG_RUN_BYTES:
            event("valid, a long run: not run")
            return 0
    else:
        lines = assert_clean_error(v, many_lines=True)
        assert all(line.startswith(str(path)) or line.startswith("cmemu: error: ") for line in lines)
    r = invoke("run", path, "-o", out, "--quiet")
    if r.exit_code == 0:
        assert out.is_file()
        out.unlink()
    else:
        assert_clean_error(r)
        assert not out.exists()
    assert not list(out.parent.glob(".*.tmp-*"))
    if v.exit_code != 0:
        assert r.exit_code == 2
    return v.exit_code


def _in_tmp(data: bytes, name="t.json"):
    d = tempfile.TemporaryDirectory()
    path = Path(d.name) / name
    path.write_bytes(data)
    return d, path


@settings(BASE, max_examples=300)
@given(st.binary(max_size=400), st.sampled_from(["t.json", "t.jsonl"]))
def test_random_bytes(data, name):
    d, path = _in_tmp(data, name)
    with d:
        assert check_both_commands(path, Path(d.name) / "out.h5") == 2


@settings(BASE, max_examples=300)
@given(valid_traces(max_items=8), st.data())
def test_truncated_json(doc, data):
    text = json.dumps(doc).encode()
    cut = data.draw(st.integers(0, len(text) - 1))
    d, path = _in_tmp(text[:cut])
    with d:
        assert check_both_commands(path, Path(d.name) / "out.h5") == 2


@settings(BASE, max_examples=60)
@given(valid_traces(max_items=8), st.data())
def test_truncated_jsonl(doc, data):
    # Cut at a line boundary a JSONL trace may still be valid (fewer nodes); elsewhere it is not.
    lines = [json.dumps({k: v for k, v in doc.items() if k != "nodes"})]
    lines += [json.dumps(n) for n in doc["nodes"]]
    text = "\n".join(lines).encode()
    cut = data.draw(st.integers(0, len(text) - 1))
    d, path = _in_tmp(text[:cut], "t.jsonl")
    with d:
        event(f"validate exit {check_both_commands(path, Path(d.name) / 'out.h5')}")


# Any JSON value, with the numbers Python's json reads but cmemu refuses, and deep-ish nesting.
JSON_VALUES = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.text(max_size=8),
        st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([-1, 0, 1, 1.5, 2**53, 2**53 + 1, 10**30, 1e308, -0.0, 31, 32, 7]),
    ),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=10,
)


@settings(BASE, max_examples=600)
@given(valid_traces(max_items=8), st.data())
def test_wrong_types_and_values(doc, data):
    # One field of one node (or of its attrs, or of the header) replaced by any JSON value.
    where = data.draw(st.sampled_from(["node", "attrs", "header"]))
    value = data.draw(JSON_VALUES)
    if where == "header":
        target = doc
    else:
        node = data.draw(st.sampled_from(doc["nodes"]))
        target = node if where == "node" else node["attrs"]
    keys = sorted(target) + ["id", "rank", "stream", "data_deps", "comm_size", "x-extra", "bogus"]
    key = data.draw(st.sampled_from(keys))
    if where == "header" and key == "nodes":
        key = "version"
    target[key] = value
    d, path = _in_tmp(json.dumps(doc).encode())  # writes NaN and Infinity as Python does
    with d:
        event(f"validate exit {check_both_commands(path, Path(d.name) / 'out.h5')}")


RAW_NUMBERS = ["NaN", "-NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1E999999999", "9" * 5000,
               "-" + "9" * 5000, "9" * 4000, "9007199254740993", "1.0000000000000002", "-0", "1e-400",
               "123456789012345678901234567890"]


@pytest.mark.parametrize("raw", RAW_NUMBERS)
@pytest.mark.parametrize("field", ["id", "rank", "comm_size", "comm_dst", "stream", "version"])
def test_huge_numbers_and_nan_as_written(tmp_path, raw, field):
    # Numbers as they appear in the file, including ones Python cannot turn into an int.
    nodes = [{"id": 0, "type": "COMM_SEND", "rank": 0, "stream": 0, "attrs": {"comm_dst": 2, "comm_size": 64}},
             {"id": 1, "type": "COMM_RECV", "rank": 2, "attrs": {"comm_src": 0, "comm_size": 64}}]
    text = json.dumps({**HEADER, "nodes": nodes})
    marker = {"id": '"id": 0', "rank": '"rank": 0', "stream": '"stream": 0', "version": '"version": 1',
              "comm_size": '"comm_size": 64', "comm_dst": '"comm_dst": 2'}[field]
    text = text.replace(marker, marker.split(":")[0] + ": " + raw, 1)
    path = tmp_path / "t.json"
    path.write_text(text)
    status = check_both_commands(path, tmp_path / "out.h5")
    if raw not in ("-0", "1e-400") or field == "version":  # those read as 0, which may be fine
        assert status == 2


def _deep(depth, open_="[", close="]"):
    return open_ * depth + close * depth


@pytest.mark.parametrize("where", ["document", "attr", "jsonl-line", "objects"])
def test_deep_nesting(tmp_path, where):
    # 100000 levels: Python's json would raise RecursionError; it must become a clean error.
    depth = 100_000
    header = json.dumps(HEADER)
    if where == "document":
        path, text = tmp_path / "t.json", _deep(depth)
    elif where == "objects":
        path, text = tmp_path / "t.json", '{"a":' * depth + "1" + "}" * depth
    elif where == "attr":
        node = '{"id": 0, "type": "COMP", "rank": 0, "attrs": {"cmemu.duration_ns": 1, "x-deep": %s}}'
        path, text = tmp_path / "t.json", header[:-1] + ', "nodes": [' + node % _deep(depth) + "]}"
    else:
        path, text = tmp_path / "t.jsonl", header + "\n" + _deep(depth) + "\n"
    path.write_text(text)
    assert check_both_commands(path, tmp_path / "out.h5") == 2
    # The real command too: its own interpreter, recursion limit and stack.
    proc = subprocess.run([sys.executable, "-m", "cmemu.cli", "run", str(path), "-o", str(tmp_path / "o.h5")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "nested too deeply" in proc.stderr
    assert not (tmp_path / "o.h5").exists()


def test_nesting_the_checker_accepts_still_runs(tmp_path):
    # Just under Python's limit, an 'x-' attribute may hold deep structure: kept, ignored, runs.
    node = {"id": 0, "type": "COMP", "rank": 0, "attrs": {"cmemu.duration_ns": 1, "x-deep": json.loads(_deep(500))}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({**HEADER, "nodes": [node]}))
    assert check_both_commands(path, tmp_path / "out.h5") == 0


def test_a_million_nodes_end_to_end_in_bounded_time(tmp_path):
    # A million nodes, the last of them bad: `trace validate` must read and check them all, name
    # the one problem, and finish in seconds, not minutes (the timeout is generous for a shared
    # machine; about 10 s is usual).
    n = 1_000_000
    path = tmp_path / "million.jsonl"
    with path.open("w") as f:
        f.write(json.dumps(HEADER) + "\n")
        f.writelines(f'{{"id":{i},"type":"COMP","rank":{i % 32},"attrs":{{"cmemu.duration_ns":1}}}}\n'
                     for i in range(n - 1))
        f.write(f'{{"id":{n - 1},"type":"COMP","rank":32,"attrs":{{"cmemu.duration_ns":1}}}}\n')
    proc = subprocess.run([sys.executable, "-m", "cmemu.cli", "trace", "validate", str(path)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and f"node {n - 1}: field 'rank'" in lines[0], proc.stderr
    # And `run` with a memory limit too small for it refuses before reading it.
    proc = subprocess.run([sys.executable, "-m", "cmemu.cli", "run", str(path), "--max-memory", "512MiB",
                           "-o", str(tmp_path / "o.h5")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--max-memory" in proc.stderr and not (tmp_path / "o.h5").exists()


def test_validate_reports_every_problem_one_line_each(tmp_path):
    nodes = [
        {"id": 0, "type": "FOO", "rank": 0},
        {"id": 1, "type": "COMP", "rank": 99, "attrs": {"num_ops": -1}},
        {"id": 2, "type": "COMM_RECV", "rank": 0, "attrs": {"comm_src": 1, "comm_size": 8}},
        {"id": 3, "type": "COMP", "rank": 0, "data_deps": [42], "attrs": {"cmemu.duration_ns": math.inf}},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({**HEADER, "nodes": nodes}))
    result = invoke("trace", "validate", path)
    lines = assert_clean_error(result, many_lines=True)
    expected = [("node 0", "'type'"), ("node 1", "'rank'"), ("node 1", "'num_ops'"), ("node 2", "'comm_src'"),
                ("node 3", "'data_deps'"), ("node 3", "'cmemu.duration_ns'")]
    assert len(lines) == len(expected), lines
    for line, (node, field) in zip(sorted(lines), sorted(expected)):
        assert line.startswith(f"{path}: {node}: field {field}: "), line


def test_validate_ok_line_and_system_option(tmp_path):
    nodes = [{"id": 0, "type": "COMM_SEND", "rank": 0, "attrs": {"comm_dst": 700, "comm_size": 8}},
             {"id": 1, "type": "COMM_RECV", "rank": 700, "attrs": {"comm_src": 0, "comm_size": 8}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({**HEADER, "nodes": nodes}))
    # On `mini` (the trace's system) die 700 does not exist; on cloudmatrix384 it does.
    lines = assert_clean_error(invoke("trace", "validate", path), many_lines=True)
    assert len(lines) == 2 and "node 0: field 'comm_dst'" in lines[0] and "node 1: field 'rank'" in lines[1]
    ok = invoke("trace", "validate", path, "--system", "cloudmatrix384")
    assert ok.exit_code == 0 and ok.stdout.startswith("ok: 2 nodes, 1 messages")
    assert_clean_error(invoke("trace", "validate", path, "--system", "nonesuch"))
    assert_clean_error(invoke("trace", "validate", tmp_path / "missing.json"))
