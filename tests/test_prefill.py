"""DeepSeek-R1 prefill trace generator and the prefill scenario."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from cmemu.cli import main
from cmemu.errors import CmemuError
from cmemu.scenarios.common import run_doc
from cmemu.scenarios.prefill import layer_times_ps, prefill_metrics
from cmemu.spec import load_system
from cmemu.trace.deepseek import PrefillConfig, prefill_trace
from cmemu.vocab import PIPE_CODE
from cmemu.workload.moe import moe_routing

# EP8 in two attention TP groups of 4 dies; 4 requests of 256 tokens, 2 micro-batches: one request
# per group and micro-batch, 256 / 4 = 64 tokens per die in the sequence-parallel stages.
SMALL = dict(ep=8, attn_tp=4, requests=4, prompt_len=256)


@pytest.fixture(scope="module")
def mini():
    return load_system("mini")


def _run(spec, cfg):
    doc = prefill_trace(cfg, spec.name, spec.dies)
    return doc, run_doc(doc, spec)


@pytest.fixture(scope="module")
def small_run(mini):
    return _run(mini, PrefillConfig(layers=2, **SMALL))


def _ops(result, name, rank=None):
    L = result.lowered
    return [i for i, n in enumerate(L.op_name) if n == name and (rank is None or L.op_rank[i] == rank)]


def test_op_counts_per_layer():
    cfg = PrefillConfig(ep=8, attn_tp=4, requests=8, prompt_len=128, layers=3)  # 2 requests per group and mb
    doc = prefill_trace(cfg, "mini", 32)
    names = [n["name"] for n in doc["nodes"]]
    # Per die and micro-batch: 6 SP prologue ops, the all-gather, q_up, kv_up and the queries'
    # RoPE, one attention per request of the group (2), the all-to-all, o_proj and the FFN norm
    # (15); a dense layer adds 3 FFN ops, a MoE layer the gate, dispatch, 3 expert ops and combine (6).
    per_die_mb = {"dense": 15 + 3, "moe": 15 + 6}
    assert cfg.dense_layers == 2 and cfg.tokens_per_die == 2 * 128 // 4
    layers = 8 * 2 * (2 * per_die_mb["dense"] + per_die_mb["moe"])
    # Sampling: a group's 2 requests end at tokens 127 and 255 of its 256, on its dies 1 and 3
    # (64 tokens each): 2 ops on 2 dies of each of 2 groups, per micro-batch.
    assert len(names) == layers + 2 * 2 * 2 * 2
    assert sum(n.endswith(".attention") for n in names) == 8 * 2 * 3 * 2
    assert sum(n.endswith(".dispatch") for n in names) == 8 * 2 * 1
    assert sorted({n["rank"] for n in doc["nodes"] if n["name"].endswith(".lm_head")}) == [1, 3, 5, 7]
    att = next(n for n in doc["nodes"] if n["name"].endswith(".attention"))
    assert att["attrs"] == {"cmemu.op": "mla_prefill_attention", "cmemu.tokens": 128, "cmemu.kv_len": 128,
                            "cmemu.heads": 128 // 4}
    # Ten experts per die: EP8 routes over 80 experts; 8 routed + the shared one.
    disp = next(n for n in doc["nodes"] if n["name"].endswith(".dispatch"))
    assert disp["attrs"]["cmemu.experts"] == 80 and disp["attrs"]["cmemu.top_k"] == 9
    assert disp["attrs"]["cmemu.engine"] == "sdma"
    assert doc["groups"] == {"ep": list(range(8)), "tp0": [0, 1, 2, 3], "tp1": [4, 5, 6, 7]}


def test_expert_gemms_hold_the_tokens_routed_to_the_die():
    cfg = PrefillConfig(layers=1, skew=1.0, **SMALL)
    doc = prefill_trace(cfg, "mini", 32)
    routing = moe_routing(64, 9, 80, 8, 1.0, 1)  # micro-batch 1: seed 0 + 1
    for node in doc["nodes"]:
        if node["name"] == "L0.mb1.expert_swiglu":
            got = int((routing == node["rank"]).sum())
            assert node["attrs"]["cmemu.rows"] == got
            up = next(n for n in doc["nodes"] if n["name"] == "L0.mb1.expert_up" and n["rank"] == node["rank"])
            assert up["attrs"]["cmemu.m"] == -(-got // 10) and up["attrs"]["cmemu.groups"] == 10


def test_sp_tp_sp_collectives_and_their_sizes(small_run):
    doc, r = small_run
    s = 64  # tokens per die
    gather = [n for n in doc["nodes"] if n["name"] == "L0.mb0.attn_gather"]
    a2a = [n for n in doc["nodes"] if n["name"] == "L0.mb0.attn_a2a"]
    # All-gather: each die's latents, q (1536) + kv (512) + k_pe (64) BF16 values per token.
    assert {n["attrs"]["comm_size"] for n in gather} == {s * (1536 + 512 + 64) * 2}
    # All-to-all: to each other die of the group, that die's tokens' output for my 32 heads.
    assert {n["attrs"]["comm_size"] for n in a2a} == {s * 32 * 128 * 2}
    assert {n["attrs"]["comm_type"] for n in gather} == {"ALL_GATHER"}
    assert {n["attrs"]["comm_type"] for n in a2a} == {"ALL_TO_ALL"}
    assert {n["attrs"]["cmemu.group"] for n in gather if n["rank"] < 4} == {"tp0"}
    assert {n["attrs"]["cmemu.group"] for n in gather if n["rank"] >= 4} == {"tp1"}
    # Simulated: each member's SDMA engines moved comm_size to each of the 3 others of its group
    # (busy time on an engine, and the write), and the stages run in order.
    t = r.tasks
    for name, size in (("L0.mb0.attn_gather", s * 4224), ("L0.mb0.attn_a2a", s * 32 * 256)):
        for i in _ops(r, name):
            # (Not the flag send: one op writing 32 B to each of the 3 others.)
            mine = (t["op"] == i) & (t["pipe"] == PIPE_CODE["SDMA"]) & (t["bytes"] > 3 * 32)
            assert set(t["bytes"][mine].tolist()) == {size}
            assert int(t["bytes"][mine].sum()) == 2 * 3 * size
    for rank in range(8):
        q_down = _ops(r, "L0.mb0.kv_down", rank)[0]
        g, att = _ops(r, "L0.mb0.attn_gather", rank)[0], _ops(r, "L0.mb0.attention", rank)[0]
        a, o = _ops(r, "L0.mb0.attn_a2a", rank)[0], _ops(r, "L0.mb0.o_proj", rank)[0]
        for before, after in ((q_down, g), (g, att), (att, a), (a, o)):
            assert r.op_end_ps[before] <= r.op_start_ps[after]


def test_reuse_skips_compute_and_fetches_kv(mini, small_run):
    doc0, r0 = small_run
    cfg = PrefillConfig(layers=2, reuse=0.5, **SMALL)
    doc, r = _run(mini, cfg)
    assert cfg.reused_tokens == 128 and cfg.new_tokens == 128 and cfg.tokens_per_die == 32
    att = {(n["attrs"]["cmemu.tokens"], n["attrs"]["cmemu.kv_len"]) for n in doc["nodes"]
           if n["name"].endswith(".attention")}
    assert att == {(128, 256)}  # the new half attends to itself and to the reused half
    q = {n["attrs"]["cmemu.m"] for n in doc["nodes"] if n["name"].endswith(".q_down")}
    assert q == {32}
    # The reused KV is loaded instead: 128 tokens x 576 B (INT8) per layer, micro-batch and die
    # (one request per group and micro-batch), and its up-projection (then attention) waits for it.
    loads = [n for n in doc["nodes"] if n["type"] == "MEM_LOAD"]
    assert len(loads) == 8 * 2 * 2
    assert {n["attrs"]["tensor_size"] for n in loads} == {128 * 576}
    assert not any(n["type"] == "MEM_LOAD" for n in doc0["nodes"])
    bf16 = prefill_trace(PrefillConfig(layers=1, reuse=0.5, int8=False, **SMALL), "mini", 32)
    assert {n["attrs"]["tensor_size"] for n in bf16["nodes"] if n["type"] == "MEM_LOAD"} == {128 * 1152}
    for rank in range(8):
        f, a = _ops(r, "L1.mb1.kv_fetch", rank)[0], _ops(r, "L1.mb1.kv_up", rank)[0]
        assert r.op_end_ps[f] <= r.op_start_ps[a] and r.op_end_ps[f] > r.op_start_ps[f]
    # A quarter of the attention work is skipped (the reused half's own causal triangle): it
    # takes less time.
    d0 = [r0.op_end_ps[i] - r0.op_start_ps[i] for i in _ops(r0, "L0.mb0.attention")]
    d1 = [r.op_end_ps[i] - r.op_start_ps[i] for i in _ops(r, "L0.mb0.attention")]
    assert max(d1) < min(d0)


# DeepSeek-R1 MACs per token (docs/machine.md 2.7): q_a 7168 -> 1536, kv_a 7168 -> 512 + 64, q_b 1536 ->
# 128 x (128 + 64), kv_b 512 -> 128 x (128 + 128), o_proj 128 x 128 -> 7168.
Q_A, KV_A, Q_B, KV_B, O = 7168 * 1536, 7168 * 576, 1536 * 128 * 192, 512 * 128 * 256, 128 * 128 * 7168


def test_every_projection_is_counted_once(mini):
    from cmemu.die.ops import node_cost

    # 4 requests of 256 tokens, half reused: 128 new tokens each go through q_a, kv_a, q_b and
    # o_proj once; kv_b also rebuilds the reused half's K and V from its cached latents.
    cfg = PrefillConfig(layers=2, reuse=0.5, **SMALL)
    doc = prefill_trace(cfg, "mini", 32)
    new, prompt, req = cfg.new_tokens, cfg.prompt_len, cfg.requests
    layer = [n for n in doc["nodes"] if n["name"].startswith("L1.") and n["type"] == "COMP"]
    attn_part = [n for n in layer if n["name"].rsplit(".", 1)[1] in
                 ("rmsnorm_in", "q_down", "rmsnorm_q", "kv_down", "rmsnorm_kv", "rope_k", "q_up", "kv_up", "rope_q",
                  "attention", "o_proj")]
    gemms = [n for n in attn_part if n["attrs"]["cmemu.op"] == "gemm"]
    trace_macs = sum(n["attrs"]["cmemu.m"] * n["attrs"]["cmemu.n"] * n["attrs"]["cmemu.k"] for n in gemms)
    proj = req * new * (Q_A + KV_A + Q_B + O) + req * prompt * KV_B
    assert trace_macs == proj == 4 * 128 * (11_010_048 + 4_128_768 + 37_748_736 + 117_440_512) + 4 * 256 * 16_777_216
    # The die model's MACs over the layer's attention part: the projections once, plus causal
    # attention (each new token over the 128 reused positions, itself and the new ones before it,
    # 192 + 128 MACs per head and pair); the attention op holds no projection of its own.
    att_macs = req * 128 * (new * (prompt - new) + new * (new + 1) // 2) * (192 + 128)
    die = mini.die
    model_macs = sum(node_cost(die, n["attrs"]).macs for n in attn_part)
    assert model_macs == proj + att_macs
    assert sum(node_cost(die, n["attrs"]).macs for n in attn_part if n["name"].endswith(".attention")) == att_macs


def test_micro_batches_overlap(small_run):
    # One micro-batch's collectives (on SDMA) run while the other computes: the two streams' busy
    # intervals on a die intersect, and a collective of one overlaps a compute op of the other.
    doc, r = small_run
    L = r.lowered
    types = {n["id"]: n["type"] for n in doc["nodes"]}
    kind = np.array([types[i] for i in L.op_node_id])
    on0 = (L.op_rank == 0)

    def overlap(a, b):
        return sum(max(0, min(r.op_end_ps[x], r.op_end_ps[y]) - max(r.op_start_ps[x], r.op_start_ps[y]))
                   for x in a for y in b)

    s0 = np.flatnonzero(on0 & (L.op_stream == 0))
    s1 = np.flatnonzero(on0 & (L.op_stream == 1))
    assert overlap(s0, s1) > 0
    comm0 = np.flatnonzero(on0 & (L.op_stream == 0) & (kind == "COMM_COLL"))
    comp1 = np.flatnonzero(on0 & (L.op_stream == 1) & (kind == "COMP"))
    comm1 = np.flatnonzero(on0 & (L.op_stream == 1) & (kind == "COMM_COLL"))
    comp0 = np.flatnonzero(on0 & (L.op_stream == 0) & (kind == "COMP"))
    assert overlap(comm0, comp1) + overlap(comm1, comp0) > 0


def test_ttft_and_tokens_per_s_accounting(small_run):
    doc, r = small_run
    cfg = PrefillConfig(layers=2, **SMALL)
    m, per_class = prefill_metrics(cfg, r)
    step_s = r.sim_end_ps / 1e12
    assert m["ttft_ms"] == pytest.approx(step_s * 1e3, abs=1e-3)
    # 4 requests x 256 prompt tokens per step, over EP8 = 4 NPUs.
    assert m["prompt_tokens_per_step"] == 4 * 256
    assert m["tokens_per_s_per_npu"] == pytest.approx(4 * 256 / step_s / 4, rel=1e-3)
    times = layer_times_ps(cfg, r)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert m["dense_layer_time_us"] == pytest.approx(times[0] / 1e6, abs=0.1)
    assert m["moe_layer_time_us"] == pytest.approx(times[1] / 1e6, abs=0.1)
    # 61 layers: the 2 simulated (1 dense, 1 MoE) plus 2 more dense and 57 more MoE layers.
    full_s = (r.sim_end_ps + 2 * times[0] + 57 * times[1]) / 1e12
    assert m["ttft_61_layers_extrapolated_ms"] == pytest.approx(full_s * 1e3, abs=1e-3)
    assert m["tokens_per_s_per_npu_61_layers_extrapolated"] == pytest.approx(4 * 256 / full_s / 4, rel=1e-3)
    assert 0 <= m["exposed_comm_us"] <= m["ttft_ms"] * 1e3
    for cls in ("attention", "attn_gather", "attn_a2a", "dispatch", "expert_mlp", "combine", "sampling"):
        assert per_class[f"{cls}_us"] > 0
    # Reused tokens are prompt tokens too: the throughput counts them.
    m2, _ = prefill_metrics(PrefillConfig(layers=2, reuse=0.5, **SMALL), r)
    assert m2["prompt_tokens_per_step"] == 4 * 256 and m2["new_tokens_per_step"] == 4 * 128


def test_bad_config():
    with pytest.raises(CmemuError, match="--ep"):
        prefill_trace(PrefillConfig(ep=64), "mini", 32)
    with pytest.raises(CmemuError, match="--attn-tp"):
        prefill_trace(PrefillConfig(ep=8, attn_tp=3), "mini", 32)
    with pytest.raises(CmemuError, match="--requests 3"):
        prefill_trace(PrefillConfig(ep=8, attn_tp=4, requests=3), "mini", 32)
    with pytest.raises(CmemuError, match="--reuse"):
        prefill_trace(PrefillConfig(reuse=1.5), "mini", 32)
    # Full reuse still computes the last token (its logits give the first output token).
    cfg = PrefillConfig(reuse=1.0, **SMALL)
    assert cfg.new_tokens == 1 and cfg.reused_tokens == 255


def test_cli_trace_gen_prefill_and_decode(tmp_path):
    runner = CliRunner()
    out = tmp_path / "p.json"
    res = runner.invoke(main, ["trace", "gen", "deepseek-r1", "--phase", "prefill", "-s", "mini", "--ep", "8",
                               "--attn-tp", "4", "--requests", "4", "--prompt-len", "256", "--reuse", "0.25",
                               "--ems-plane", "hbm", "--layers", "2", "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["cmemu.generator"]["phase"] == "prefill" and doc["cmemu.generator"]["reuse"] == 0.25
    assert doc["nodes"] == prefill_trace(PrefillConfig(layers=2, reuse=0.25, **SMALL), "mini", 32)["nodes"]
    res = runner.invoke(main, ["trace", "validate", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["trace", "gen", "deepseek-r1", "-s", "mini", "--ep", "4", "--layers", "2",
                               "-o", str(tmp_path / "d.json")])
    assert res.exit_code == 0, res.output
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["cmemu.generator"]["phase"] == "decode" and d["cmemu.generator"]["dispatch_engine"] == "aiv"
    res = runner.invoke(main, ["trace", "gen", "deepseek-r1", "--phase", "prefill", "-s", "mini", "--ep", "8",
                               "--attn-tp", "4", "--requests", "3", "-o", str(tmp_path / "bad.json")])
    assert res.exit_code == 2 and "--requests 3" in res.output


def test_scenario_command_prints_figures_with_units():
    res = CliRunner().invoke(main, ["scenario", "run", "prefill", "-s", "mini", "--ep", "8", "--attn-tp", "4",
                                    "--requests", "4", "--prompt-len", "256", "--reuse", "0.5", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # (a first compile's notice goes to stderr)
    row = doc["tables"]["prefill step"][0]
    for key in ("ttft_ms", "moe_layer_time_us", "dense_layer_time_us", "tokens_per_s_per_npu", "exposed_comm_us",
                "ttft_61_layers_extrapolated_ms", "tokens_per_s_per_npu_61_layers_extrapolated", "ems_prefix_in_hbm_ms"):
        assert row[key] > 0
    # The reused half is one 128-token EMS block, fetched over UB (the default); 3 layers with a fetch.
    assert row["new_tokens_per_step"] == 4 * 128 and row["reused_tokens_per_prompt"] == 128
    assert doc["parameters"]["reuse"] == 0.5 and doc["parameters"]["ems_plane"] == "ub"
    assert row["layers_simulated"] == 3
    assert doc["tables"]["mean busy time per die by op class (us)"][0]["kv_fetch_us"] > 0
