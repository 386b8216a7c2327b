"""DeepSeek-R1 decode trace generator and the decode scenario."""
import json

import numpy as np
import pytest

from cmemu.errors import CmemuError
from cmemu.workload.moe import dispatch_payload_byte, moe_routing
from cmemu.run import run_trace
from cmemu.scenarios.decode import decode_metrics
from cmemu.trace.deepseek import DecodeConfig, decode_trace
from cmemu.workload.deepseek import HIDDEN
from conftest import TRACES


def _run(tmp_path, cfg):
    doc = decode_trace(cfg, "mini", 32)
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc))
    return doc, run_trace(path, progress=False)


def test_op_counts_per_layer():
    cfg = DecodeConfig(ep=4, tokens_per_die=8, layers=3, mtp=False)
    doc = decode_trace(cfg, "mini", 32)
    names = [n["name"] for n in doc["nodes"]]
    # Per die and micro-batch: 10 attention ops; a dense layer adds 4 FFN ops, a MoE layer the
    # FFN norm, gate, dispatch, 3 expert ops and combine (7); then 2 sampling ops.
    per_die_mb = {"dense": 10 + 4, "moe": 10 + 7}
    assert cfg.dense_layers == 2
    expected = 4 * 2 * (2 * per_die_mb["dense"] + per_die_mb["moe"] + 2)
    assert len(names) == expected
    assert sum(n.endswith(".dispatch") for n in names) == 4 * 2 * 1
    assert not any(n.startswith("MTP") for n in names)
    with_mtp = decode_trace(DecodeConfig(ep=4, tokens_per_die=8, layers=3, mtp=True), "mini", 32)
    assert sum(n["name"].startswith("MTP.") for n in with_mtp["nodes"]) == 4 * 2 * per_die_mb["moe"]


def test_expert_gemm_rows_are_the_tokens_routed_to_the_die():
    cfg = DecodeConfig(ep=8, tokens_per_die=16, layers=2, mtp=False, skew=1.0)
    doc = decode_trace(cfg, "mini", 32)
    routing = moe_routing(8, 8, 8, 8, 1.0, 0)  # micro-batch 0: 8 tokens to all 8 experts (EP8 < top-9)
    for node in doc["nodes"]:
        if node["name"] == "L1.mb0.expert_up":
            assert node["attrs"]["cmemu.m"] == max(1, int((routing == node["rank"]).sum()))


def test_dispatch_bytes_are_tokens_times_topk_times_payload(tmp_path):
    cfg = DecodeConfig(ep=4, tokens_per_die=8, layers=2, mtp=False, micro_batches=1)
    doc, r = _run(tmp_path, cfg)
    from cmemu.lower.moe import dispatch_write_byte
    from cmemu.vocab import PIPE_CODE

    disp = [i for i, n in enumerate(r.lowered.op_name) if n.endswith(".dispatch")]
    t = r.tasks
    # The AIVs' write loops are AIV-Direct tasks whose bytes are their remote writes: every
    # (token, expert) pair for another die, 7,212 B each (top-k is 4 here: EP4 has 4 experts).
    routing = moe_routing(8, 4, 4, 4, 0.0, 0)
    remote = int(sum((routing[s] != s).sum() for s in range(4)))
    writes = np.isin(t["op"], disp) & (t["pipe"] == PIPE_CODE["AIV_DIRECT"]) & (t["bytes"] % dispatch_write_byte(HIDDEN) == 0)
    assert int(t["bytes"][writes].sum()) == remote * dispatch_write_byte(HIDDEN)


def test_micro_batches_overlap(tmp_path):
    # Micro-batch 1's attention work (stream 0) runs while micro-batch 0 is in its MoE part
    # (stream 1): the two streams' busy intervals on a die intersect.
    cfg = DecodeConfig(ep=4, tokens_per_die=32, layers=2, mtp=False)
    doc, r = _run(tmp_path, cfg)
    names, rank, stream = r.lowered.op_name, r.lowered.op_rank, r.lowered.op_stream
    s0 = [i for i, n in enumerate(names) if n.startswith("L1.mb1.") and rank[i] == 0 and stream[i] == 0]
    s1 = [i for i, n in enumerate(names) if n.startswith("L1.mb0.") and rank[i] == 0 and stream[i] == 1]
    overlap = sum(max(0, min(r.op_end_ps[a], r.op_end_ps[b]) - max(r.op_start_ps[a], r.op_start_ps[b]))
                  for a in s0 for b in s1)
    assert overlap > 0


def test_throughput_and_mtp_accounting(tmp_path):
    cfg = DecodeConfig(ep=4, tokens_per_die=16, layers=2, mtp=True, mtp_acceptance=0.7)
    doc, r = _run(tmp_path, cfg)
    m, per_class, _ = decode_metrics(cfg, r)
    step_s = r.sim_end_ps / 1e12
    assert m["step_time_us"] == pytest.approx(r.sim_end_ps / 1e6, abs=0.1)
    # Each request decodes 1 + 0.7 tokens per step; 16 tokens per die = 8 requests (with MTP).
    assert m["tpot_ms"] == pytest.approx(step_s * 1e3 / 1.7, rel=1e-3)
    assert m["tokens_per_s_per_npu"] == pytest.approx(2 * 8 * 1.7 / step_s, rel=1e-3)
    assert per_class["attention_us"] > 0 and per_class["dispatch_us"] > 0


def test_bad_config():
    with pytest.raises(CmemuError, match="--ep"):
        decode_trace(DecodeConfig(ep=64), "mini", 32)
    with pytest.raises(CmemuError, match="micro-batches"):
        decode_trace(DecodeConfig(ep=4, micro_batches=3), "mini", 32)


def test_shipped_decode_trace_is_current():
    cfg = DecodeConfig(ep=32, layers=2)
    doc = decode_trace(cfg, "mini", 32)
    shipped = json.loads((TRACES / "deepseek_r1_decode_mini_2layers.json").read_text())
    assert shipped["nodes"] == doc["nodes"]  # regenerate: see README (cmemu trace gen ...)
