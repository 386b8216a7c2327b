"""Golden digests: what the shipped traces, the report, the scenarios and the sweep files produce
today, stored under tests/golden/, so that a change meant to keep behaviour (a refactor) shows
any output it changes. Wall times are left out (they differ run to run); so is the trace's path
(it names the checkout).

A change that is meant to change an output regenerates them, deliberately:

    pytest tests/test_golden.py --update-goldens

and the diff of tests/golden/*.json in the commit shows what changed.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import REPO, TRACES
from test_scenarios import SMALL

from cmemu.cli import main

GOLDEN = Path(__file__).resolve().parent / "golden"
WALL_TIME_ATTRS = {"wall_time_s"}
SHIPPED_TRACES = ("examples/pingpong.json", "mini_moe_layer.json", "deepseek_r1_decode_mini_2layers.json")
# (name, trace, extra `cmemu run` options)
RUNS = [(f"{Path(t).stem}-{fabric}", t, ("--fabric", fabric)) for t in SHIPPED_TRACES
        for fabric in ("packet", "message")]
RUNS += [("pingpong-reference", "examples/pingpong.json", ("--engine", "reference")),
         ("pingpong-packets-packet", "examples/pingpong.json", ("--detail", "packets")),
         ("pingpong-packets-message", "examples/pingpong.json", ("--detail", "packets", "--fabric", "message"))]
# Beyond the small options: a decode step whose communication is exposed (it is not at the small ones).
MORE_SCENARIOS = {"decode-ep8-mb12": ["decode", "-s", "mini", "--ep", "8", "--tokens-per-die", "32", "--layers", "2",
                                      "--micro-batches", "1,2"]}
REPORTED = ("mini_moe_layer-packet", "deepseek_r1_decode_mini_2layers-packet",
            "deepseek_r1_decode_mini_2layers-message")


def _plain(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()] if v.dtype.kind not in "SO" else [_plain(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _data_digest(ds) -> str:
    a = ds[()]
    h = hashlib.sha256()
    h.update(f"{ds.dtype}|{ds.shape}|".encode())
    if isinstance(a, np.ndarray) and a.dtype.kind != "O":
        h.update(np.ascontiguousarray(a).tobytes())
    else:
        h.update(json.dumps(_plain(a), sort_keys=True).encode())
    return h.hexdigest()[:20]


def timeline_digests(path) -> dict:
    """Every group's and dataset's attributes (by value; wall times left out, the trace's path
    by its name) and every dataset's dtype, shape and bytes (by a digest)."""
    out = {}

    def attrs(name, obj):
        for k in sorted(obj.attrs):
            if k in WALL_TIME_ATTRS:
                continue
            v = _plain(obj.attrs[k])
            if k == "trace_path":
                v = Path(v).name
            if k == "spec_json" or (isinstance(v, str) and len(v) > 200):
                v = "sha256:" + hashlib.sha256(str(v).encode()).hexdigest()[:20]
            out[f"{name}@{k}"] = v

    with h5py.File(path, "r") as f:
        attrs("/", f)

        def visit(name, obj):
            attrs("/" + name, obj)
            if isinstance(obj, h5py.Dataset):
                out["/" + name] = _data_digest(obj)

        f.visititems(visit)
    return out


def _invoke(*args) -> str:
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def _check(name: str, got, update: bool):
    path = GOLDEN / f"{name}.json"
    text = json.dumps(got, indent=1, sort_keys=True) + "\n"
    if update:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"no golden {path.name}: run pytest {Path(__file__).name} --update-goldens"
    want = json.loads(path.read_text())
    got = json.loads(text)
    if isinstance(want, dict):
        changed = sorted(k for k in set(want) | set(got) if want.get(k, "<absent>") != got.get(k, "<absent>"))
        assert not changed, f"{name}: {len(changed)} entries differ from the golden, e.g. " + "; ".join(
            f"{k}: {want.get(k, '<absent>')!r} -> {got.get(k, '<absent>')!r}"[:300] for k in changed[:5])
    assert want == got


@pytest.fixture(scope="module")
def timelines(tmp_path_factory):
    folder = tmp_path_factory.mktemp("golden")
    out = {}
    for name, trace, options in RUNS:
        out[name] = folder / f"{name}.h5"
        _invoke("run", TRACES / trace, "-q", "-o", out[name], *options)
    return out


@pytest.mark.parametrize("name", [r[0] for r in RUNS])
def test_timeline_matches_golden(name, timelines, update_goldens):
    _check(f"timeline-{name}", timeline_digests(timelines[name]), update_goldens)


@pytest.mark.parametrize("name", REPORTED)
def test_report_json_matches_golden(name, timelines, update_goldens):
    _check(f"report-{name}", json.loads(_invoke("report", timelines[name], "--json")), update_goldens)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_scenario_json_matches_golden(name, update_goldens):
    _check(f"scenario-{name}", json.loads(_invoke("scenario", "run", name, *SMALL[name], "--json")),
           update_goldens)


@pytest.mark.parametrize("name", sorted(MORE_SCENARIOS))
def test_more_scenario_json_matches_golden(name, update_goldens):
    _check(f"scenario-{name}", json.loads(_invoke("scenario", "run", *MORE_SCENARIOS[name], "--json")), update_goldens)


def test_sweep_point_keys_match_golden(update_goldens):
    """A re-run of a sweep skips the points it finished: their keys must not move."""
    from cmemu.sweep import load_sweep

    keys = {}
    for path in sorted((REPO / "traces" / "sweeps").glob("*.toml")):
        sw = load_sweep(path)
        keys[path.name] = [{"key": p.key, "parameters": p.parameters} for p in sw.points]
    _check("sweep-keys", keys, update_goldens)
