"""A trace in memory (cmemu.trace.TraceDocument) runs as the same trace written to a file and
read back: the scenarios hand their generated steps to the run that way (issue 20)."""
import copy
import hashlib

import h5py
import numpy as np
import pytest

from cmemu.errors import TraceError
from cmemu.run import run_trace
from cmemu.scenarios import run_scenario
from cmemu.scenarios.decode import decode_metrics
from cmemu.scenarios.prefill import prefill_metrics
from cmemu.spec import load_system
from cmemu.trace import TraceDocument, read_document
from cmemu.trace.deepseek import DecodeConfig, PrefillConfig, decode_trace, prefill_trace
from cmemu.trace.writer import write_trace

MINI = load_system("mini")
DECODE = DecodeConfig(ep=4, tokens_per_die=8, kv_len=256, layers=2)
PREFILL = PrefillConfig(ep=8, attn_tp=4, requests=4, prompt_len=256, layers=2)
# Results that hold no figure of the run, or hold objects compared through their figures.
NOT_FIGURES = ("spec", "topology", "trace", "lowered", "wall_time_s")


def _write(tmp_path, doc):
    """The document as `cmemu trace gen` writes a .json."""
    path = tmp_path / "step.json"
    with path.open("w", encoding="utf-8") as f:
        write_trace(doc, f)
    return path


def _same_results(a, b):
    for name in a.__dataclass_fields__:
        if name in NOT_FIGURES:
            continue
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, dict):
            assert x.keys() == y.keys(), name
            for k in x:
                assert np.array_equal(np.asarray(x[k]), np.asarray(y[k])), f"{name}.{k}"
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), name
        else:
            assert x == y, name
    assert a.lowered.op_name == b.lowered.op_name
    assert [n.attrs for n in a.trace.nodes] == [n.attrs for n in b.trace.nodes]


@pytest.mark.parametrize("fabric", ["packet", "message"])
def test_generated_step_in_memory_runs_as_its_file(tmp_path, fabric):
    doc = decode_trace(DECODE, MINI.name, MINI.dies)
    path = _write(tmp_path, doc)
    from_file = run_trace(path, spec=MINI, progress=False, link_bin_ns=0, fabric_model=fabric)
    in_memory = run_trace(TraceDocument(doc), spec=MINI, progress=False, link_bin_ns=0, fabric_model=fabric)
    _same_results(from_file, in_memory)
    assert from_file.events > 0 and from_file.trace.path == str(path)


def test_scenarios_report_what_the_file_run_reports(tmp_path):
    """The decode and prefill scenarios (in memory) against their metrics of the file run."""
    for name, cfg, generate, metrics, options in (
            ("decode", DECODE, decode_trace, decode_metrics,
             {"ep": 4, "tokens_per_die": 8, "kv_len": 256, "layers": 2}),
            ("prefill", PREFILL, prefill_trace, prefill_metrics,
             {"ep": 8, "attn_tp": 4, "requests": 4, "prompt_len": 256, "layers": 2})):
        _params, tables = run_scenario(name, "mini", **options)
        path = _write(tmp_path, generate(cfg, MINI.name, MINI.dies))
        by_file = metrics(cfg, run_trace(path, spec=MINI, progress=False, link_bin_ns=0))
        assert tables[f"{name} step"] == [by_file[0]], name
        classes = tables["mean busy time per die by op class (us)"][0]
        assert {k: v for k, v in classes.items() if k != "micro_batches"} == by_file[1], name


def test_the_run_takes_the_document_over():
    source = TraceDocument(decode_trace(DECODE, MINI.name, MINI.dies), "<step>")
    run_trace(source, spec=MINI, progress=False, link_bin_ns=0)
    assert source.doc is None  # freed once checked
    with pytest.raises(ValueError, match="already run"):
        run_trace(source, spec=MINI, progress=False, link_bin_ns=0)


def test_timeline_of_a_document_records_the_hash_of_its_file(tmp_path):
    """The digest of the file `cmemu trace gen` would write: the same as that file's run records."""
    doc = decode_trace(DECODE, MINI.name, MINI.dies)
    path = _write(tmp_path, doc)
    run_trace(TraceDocument(copy.deepcopy(doc), "<step>"), spec=MINI, progress=False, output=tmp_path / "m.h5")
    run_trace(read_document(path), spec=MINI, progress=False, output=tmp_path / "f.h5")
    with h5py.File(tmp_path / "m.h5") as m, h5py.File(tmp_path / "f.h5") as f:
        assert m.attrs["trace_sha256"] == f.attrs["trace_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert m.attrs["trace_path"] == "<step>" and f.attrs["trace_path"] == str(path)
        assert np.array_equal(m["ops"]["end_ps"][:], f["ops"]["end_ps"][:])


def test_a_bad_document_is_named_in_its_error():
    doc = decode_trace(DECODE, MINI.name, MINI.dies)
    doc["nodes"][3]["rank"] = 999
    with pytest.raises(TraceError, match=r"^<bad step>: node 3"):
        run_trace(TraceDocument(doc, "<bad step>"), spec=MINI, progress=False)
