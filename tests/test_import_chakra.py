"""cmemu trace import/export chakra (cmemu/trace/importers/chakra.py), on tests/data/chakra and the
shipped traces. Needs the optional extra mlc-chakra (cmemu[chakra]) but for the missing-extra test."""
import builtins
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cmemu.errors import CmemuError
from cmemu.trace import load_trace

DATA = Path(__file__).parent / "data" / "chakra"
ROOT = Path(__file__).parent.parent


def _nodes(trace):
    return {n.id: (n.name, n.type, n.rank, n.stream, n.data_deps, n.ctrl_deps, n.attrs) for n in trace.nodes}


@pytest.mark.parametrize("name", ["traces/examples/pingpong.json", "traces/mini_moe_layer.json"])
def test_round_trip_keeps_nodes_deps_and_sizes(name, tmp_path):
    pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
    from cmemu.importers import export_chakra
    from cmemu.trace.importers.chakra import chakra_to_doc

    path = ROOT / name
    prefix = str(tmp_path / "et")
    export_chakra(path, prefix)
    original = load_trace(path, num_ranks=32)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"et.{r}.et" for r in {n.rank for n in original.nodes})
    doc, unmapped = chakra_to_doc(prefix, original.system)
    back = tmp_path / "back.json"
    back.write_text(json.dumps(doc))
    again = load_trace(back, num_ranks=32)
    assert _nodes(again) == _nodes(original) and unmapped.lines() == []
    assert again.header == original.header


def test_import_of_a_chakra_trace_written_by_mlc_chakra(tmp_path):
    pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
    from cmemu.trace.importers.chakra import chakra_to_doc

    # the shipped files are what make_allreduce.py writes (a golden file, byte for byte)
    shutil.copy(DATA / "make_allreduce.py", tmp_path)
    subprocess.run([sys.executable, "make_allreduce.py"], cwd=tmp_path, check=True)
    for r in (0, 1):
        assert (tmp_path / f"allreduce.{r}.et").read_bytes() == (DATA / f"allreduce.{r}.et").read_bytes()
    doc, unmapped = chakra_to_doc(str(DATA / "allreduce"), "mini")
    assert unmapped.lines() == ["METADATA_NODE nodes (no work): skipped: 2 (e.g. metadata)"]
    assert doc["groups"] == {"tp": [0, 1]}
    n = {(x["rank"], x["name"]): x for x in doc["nodes"]}
    assert n[0, "embed"]["attrs"] == {"cmemu.duration_ns": 10000.0}
    assert n[0, "load_weights"]["attrs"] == {"tensor_size": 1 << 20}
    coll = n[1, "allreduce_grad"]
    assert coll["attrs"] == {"comm_type": "ALL_REDUCE", "comm_size": 1 << 20, "cmemu.group": "tp"}
    assert coll["data_deps"] == [n[1, "embed"]["id"], n[1, "load_weights"]["id"]]
    assert n[0, "mlp"]["attrs"] == {"num_ops": 2 * 1024 * 7168 * 2048, "tensor_size": 2 * 7168 * 2048}
    assert n[0, "send_act"]["attrs"] == {"comm_dst": 1, "comm_size": 65536, "comm_tag": 3}
    assert n[1, "recv_act"]["attrs"] == {"comm_src": 0, "comm_size": 65536, "comm_tag": 3}
    # independent nodes go on streams of their own: the load runs beside the embedding
    assert n[0, "load_weights"].get("stream", 0) != n[0, "embed"].get("stream", 0)
    assert n[0, "mlp"].get("stream", 0) == n[0, "embed"].get("stream", 0)


def test_cli_import_and_export_chakra(tmp_path):
    pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
    from click.testing import CliRunner

    from cmemu.cli import main

    out = tmp_path / "ar.json"
    res = CliRunner().invoke(main, ["trace", "import", "chakra", str(DATA / "allreduce"), "-o", str(out), "-s", "mini"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0] == f"wrote {out}: 10 nodes on 2 rank(s) from {DATA / 'allreduce'}.*.et"
    res = CliRunner().invoke(main, ["trace", "export", "chakra", str(out), "-o", str(tmp_path / "x")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "x.0.et").exists() and (tmp_path / "x.1.et").exists()
    res = CliRunner().invoke(main, ["run", str(out), "-o", str(tmp_path / "ar.h5"), "-q"])
    assert res.exit_code == 0, res.output


def test_bad_and_missing_chakra_files(tmp_path):
    pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
    from cmemu.trace.importers.chakra import chakra_to_doc

    with pytest.raises(CmemuError, match=r"no Chakra trace files none.0.et, none.1.et"):
        chakra_to_doc(str(tmp_path / "none"))
    (tmp_path / "bad.0.et").write_bytes((DATA / "allreduce.0.et").read_bytes()[:-7])
    with pytest.raises(CmemuError, match=r"bad.0.et: (truncated or not a Chakra trace at byte \d+|not a Chakra trace)"):
        chakra_to_doc(str(tmp_path / "bad"))


def test_without_mlc_chakra_a_clear_error(monkeypatch, tmp_path):
    real = builtins.__import__

    def no_chakra(name, *args, **kwargs):
        if name == "chakra" or name.startswith("chakra."):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_chakra)
    from click.testing import CliRunner

    from cmemu.cli import main

    out = str(tmp_path / "t.json")
    res = CliRunner().invoke(main, ["trace", "import", "chakra", str(DATA / "allreduce"), "-o", out])
    assert res.exit_code == 2
    assert res.output.strip() == ("cmemu: error: Chakra traces need the optional extra mlc-chakra: pip install "
                                  "'cmemu[chakra]' (or pip install mlc-chakra)")
