"""Model descriptions from Hugging Face configs (cmemu.models.description), the model step
generator (cmemu.models.step) and the DeepSeek-R1 preset's traces, unchanged."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmemu.cli import main
from cmemu.errors import CmemuError
from cmemu.models.description import load_model, parse_count, read_config, shipped_models
from cmemu.models.step import (DecodeDeployment, PrefillDeployment, decode_step, default_experts_per_die,
                               prefill_step)

DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny_gqa_moe_config.json"


@pytest.mark.parametrize("name", sorted(shipped_models()))
def test_each_shipped_config_matches_its_model_card(name):
    entry = shipped_models()[name]
    m = load_model(name)
    # The card's total counts no MTP module (card_counts_mtp false for all of them): params()
    # does not either. Within 1%, or within the rounding of a rounded figure ("1T": 0.5T).
    card, half_unit = parse_count(entry["card_total_params"])
    assert not entry["card_counts_mtp"]
    assert abs(m.params() - card) <= max(0.01 * card, half_unit), (m.params(), card)
    # Activated parameters: the cards round them to two digits (37B, 32B, 22B, 3.3B): within 3%.
    act, _ = parse_count(entry["card_activated_params"])
    assert m.activated_params() == pytest.approx(act, rel=0.03)
    if "checkpoint_total_params" in entry:
        # DeepSeek's checkpoint stores the MTP module with its own copies of the embedding and
        # the LM head (685B = 671B + 14B).
        ckpt, _ = parse_count(entry["checkpoint_total_params"])
        assert m.params() + m.mtp_params() + m.embedding_params() == pytest.approx(ckpt, rel=0.01)


def test_the_descriptions_read_the_configs_right():
    r1 = load_model("deepseek-r1")
    assert (r1.attention, r1.query_heads, r1.q_lora_values, r1.kv_lora_values, r1.qk_rope_values) == \
        ("mla", 128, 1536, 512, 64)
    assert (r1.routed_experts, r1.shared_experts, r1.experts_per_token, r1.dense_first_layers, r1.mtp_layers) == \
        (256, 1, 8, 3, 1)
    assert (r1.router_scoring, r1.router_groups, r1.router_groups_per_token, r1.router_bias) == ("sigmoid", 8, 4, True)
    k2 = load_model("kimi-k2")
    assert (k2.query_heads, k2.routed_experts, k2.dense_first_layers, k2.router_groups, k2.mtp_layers) == \
        (64, 384, 1, 1, 0)
    q = load_model("qwen3-235b-a22b")
    assert (q.attention, q.query_heads, q.kv_heads, q.head_values, q.qk_norm, q.shared_experts,
            q.dense_first_layers) == ("gqa", 64, 4, 128, True, 0, 0)
    llama = load_model("llama-3.1-70b")
    assert (llama.moe, llama.dense_first_layers, llama.layers, llama.kv_heads, llama.qk_norm) == \
        (False, 80, 80, 8, False)
    # Qwen3-30B-A3B by hand: per layer q 2048 x 4096, k and v 2048 x 512, o 4096 x 2048, two
    # head norms of 128; 128 experts of 3 x 2048 x 768 and a 2048 x 128 router; two norms.
    q30 = load_model("qwen3-30b-a3b")
    layer = 2048 * 4096 * 2 + 2048 * 512 * 2 + 256 + 128 * 3 * 2048 * 768 + 2048 * 128 + 2 * 2048
    assert q30.params() == 48 * layer + 2048 + 2 * 151936 * 2048


def test_models_command_prints_the_counts():
    r = CliRunner().invoke(main, ["models", "--json"])
    assert r.exit_code == 0, r.output
    rows = {m["name"]: m for m in json.loads(r.stdout)["models"]}
    assert set(rows) == set(shipped_models())
    assert rows["deepseek-r1"]["params"] == load_model("deepseek-r1").params()
    assert rows["qwen3-30b-a3b"]["card_total_params"] == "30.5B"
    text = CliRunner().invoke(main, ["models"]).output
    assert "kimi-k2" in text and "GQA 64/4" in text and "1.03T" in text


def _write(tmp_path, **changes):
    doc = json.loads(TINY.read_text())
    doc.update(changes)
    doc = {k: v for k, v in doc.items() if v is not None}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("changes, field, words", [
    ({"sliding_attention_layers": 3}, "sliding_attention_layers", "unknown"),
    ({"num_key_value_heads": 3}, "num_key_value_heads", "must divide"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok", "more than the 8"),
    ({"hidden_size": None}, "hidden_size", "missing"),
    ({"hidden_size": "64"}, "hidden_size", "integer"),
    ({"mlp_only_layers": [2]}, "mlp_only_layers", "come first"),
    ({"hidden_act": "gelu"}, "hidden_act", "silu"),
    ({"kv_lora_rank": 32}, "qk_nope_head_dim", "missing"),
])
def test_unknown_or_inconsistent_fields_name_the_file_and_field(tmp_path, changes, field, words):
    p = _write(tmp_path, **changes)
    with pytest.raises(CmemuError, match=f"{p}: field '{field}': .*{words}"):
        read_config(p)


def test_an_unknown_model_name_lists_the_shipped_ones():
    with pytest.raises(CmemuError, match="unknown model 'gpt-5'.*deepseek-r1"):
        load_model("gpt-5")


def _nodes(doc, rank=0, layer="L1.mb0"):
    return {n["name"].split(".")[-1]: n for n in doc["nodes"] if n["rank"] == rank and n["name"].startswith(layer)}


def test_a_tiny_config_generates_the_op_shapes_by_hand():
    m = read_config(TINY)
    assert (m.dense_first_layers, m.moe_layers, m.qk_norm) == (1, 2, True)  # mlp_only_layers [0]
    d = DecodeDeployment(ep=4, tokens_per_die=6, kv_len=100, micro_batches=2, experts_per_die=2, layers=3)
    doc = decode_step(m, d, "mini", 32)
    a = {k: v["attrs"] for k, v in _nodes(doc).items()}
    # 3 tokens per micro-batch; q/k/v: (4 + 2 x 2) heads x 16 values from 64.
    assert (a["qkv_proj"]["cmemu.m"], a["qkv_proj"]["cmemu.n"], a["qkv_proj"]["cmemu.k"]) == (3, 128, 64)
    assert (a["rmsnorm_qk"]["cmemu.rows"], a["rmsnorm_qk"]["cmemu.cols"]) == (3 * 6, 16)
    assert (a["rope"]["cmemu.rows"], a["rope"]["cmemu.cols"]) == (3 * 6, 16)
    att = a["attention"]
    assert (att["cmemu.op"], att["cmemu.tokens"], att["cmemu.kv_len"], att["cmemu.heads"], att["cmemu.kv_heads"],
            att["cmemu.head_dim"], att["cmemu.cores"]) == ("gqa_attention", 3, 100, 4, 2, 16, 16)
    assert (a["o_proj"]["cmemu.n"], a["o_proj"]["cmemu.k"]) == (64, 64)
    assert (a["gate"]["cmemu.n"], a["gate"]["cmemu.k"]) == (8, 64)
    # No shared expert: top-2 of 4 dies x 2 slots; a die's experts share what it received.
    disp = a["dispatch"]
    assert (disp["cmemu.top_k"], disp["cmemu.experts"], disp["cmemu.cores"]) == (2, 8, 16)
    ups = [_nodes(doc, r)["expert_up"]["attrs"] for r in range(4)]
    assert all((u["cmemu.n"], u["cmemu.k"], u["cmemu.groups"]) == (64, 64, 2) for u in ups)
    received = [_nodes(doc, r)["expert_swiglu"]["attrs"]["cmemu.rows"] for r in range(4)]
    assert sum(received) == 4 * 3 * 2  # every die's 3 tokens x 2 experts
    assert [u["cmemu.m"] for u in ups] == [-(-x // 2) for x in received]
    # Layer 0 is dense: an FFN of 96 (SwiGLU: up projection to 2 x 96).
    f = {k: v["attrs"] for k, v in _nodes(doc, layer="L0.mb0").items()}
    assert (f["ffn_up"]["cmemu.n"], f["ffn_down"]["cmemu.k"]) == (192, 96) and "gate" not in f
    # No MTP layer; sampling over the 100-token vocabulary.
    assert not any(n["name"].startswith("MTP") for n in doc["nodes"])
    assert _nodes(doc, layer="sample.mb0")["lm_head"]["attrs"]["cmemu.n"] == 100
    with pytest.raises(CmemuError, match="no MTP module"):
        decode_step(m, DecodeDeployment(ep=4, mtp=True), "mini", 32)


def test_a_tiny_config_prefill_shapes_by_hand():
    m = read_config(TINY)
    d = PrefillDeployment(ep=4, prompt_len=10, requests=4, attn_tp=2, micro_batches=2, reuse=0.3, experts_per_die=2,
                          layers=2)
    doc = prefill_step(m, d, "mini", 32)
    a = {k: v["attrs"] for k, v in _nodes(doc).items()}
    # 4 requests over 2 micro-batches x 2 TP groups: one each; 3 of 10 tokens reused, 7 new,
    # split over the 2 dies of the group: 4 per die (padded).
    assert a["rmsnorm_in"]["cmemu.rows"] == 4
    assert a["attn_gather"]["comm_size"] == 4 * 64 * 2  # the die's normalised hidden states, bf16
    # TP stage: the die's 2 query heads and their 1 K/V head, for the group's 7 new tokens.
    assert (a["qkv_proj"]["cmemu.m"], a["qkv_proj"]["cmemu.n"]) == (7, (2 + 2 * 1) * 16)
    att = a["attention"]
    assert (att["cmemu.op"], att["cmemu.tokens"], att["cmemu.kv_len"], att["cmemu.heads"], att["cmemu.kv_heads"]) == \
        ("gqa_prefill_attention", 7, 10, 2, 1)
    # The reused prefix's K and V of the die's K/V head, INT8: 3 tokens x 2 x 16 values.
    assert a["kv_fetch"]["tensor_size"] == 3 * 2 * 16
    assert a["attn_a2a"]["comm_size"] == 4 * 2 * 16 * 2
    assert (a["o_proj"]["cmemu.m"], a["o_proj"]["cmemu.k"]) == (4, 64)


def test_one_micro_batch_runs_each_op_on_the_whole_die():
    """Two micro-batches split the die's 24 AIC 16 / 8 between the attention and the MoE streams
    (CloudMatrix-Infer's), so that one's attention runs beside the other's MoE; one micro-batch
    has nothing beside an op, so each op takes the whole die; cores set by hand are kept."""
    d2, d1 = DecodeDeployment(ep=8, micro_batches=2), DecodeDeployment(ep=8, micro_batches=1)
    assert d2.stream_aic(24) == (16, 8) and d1.stream_aic(24) == (24, 24)
    assert DecodeDeployment(ep=8, micro_batches=1, attn_aic=16, moe_aic=8).stream_aic(24) == (16, 8)


def test_default_expert_slots_hold_every_expert():
    assert default_experts_per_die(load_model("deepseek-r1"), 320, "ep") == 1  # 257 experts on 320 dies
    assert default_experts_per_die(load_model("kimi-k2"), 320, "ep") == 2  # 385 on 320
    assert default_experts_per_die(load_model("qwen3-235b-a22b"), 32, "ep") == 4  # 128 on 32
    assert default_experts_per_die(load_model("llama-3.1-70b"), 32, "ep") == 1


# SHA-256 of `cmemu trace gen deepseek-r1` before it became the model generator's preset (the
# first since then with one micro-batch's ops on the whole die: DecodeDeployment.stream_aic).
DEEPSEEK_TRACES = [
    (["--ep", "16", "--layers", "4", "--no-mtp", "--micro-batches", "1", "--lm-head-tp", "4", "--tokens-per-die", "33",
      "--kv-len", "1000", "--skew", "1.2", "--bf16", "--dispatch-engine", "sdma"],
     "ce981a49b0658094c9656374136202379a51caf5ef13149312757a5473f016ec"),
    (["--ep", "32", "--layers", "5"], "202074d64f7c531de434fe8d3cbffc7f149be63d911a3cdc4fb973ab34399155"),
    (["--phase", "prefill", "--ep", "16", "--attn-tp", "4", "--requests", "4", "--prompt-len", "999", "--layers", "2",
      "--micro-batches", "1", "--bf16", "--dispatch-engine", "aiv", "--skew", "0.5", "--seed", "3"],
     "713360a5ed8145c6d70b77cdbf835c06778044a076f96bc0a015080b5715fabe"),
    (["--phase", "prefill", "--layers", "4"], "ec4093fa778542ef64dd5daa3d7ffce9eac2f7d89db84566392a79b950438c69"),
]


@pytest.mark.parametrize("args, digest", DEEPSEEK_TRACES)
def test_the_deepseek_r1_trace_is_unchanged(tmp_path, args, digest):
    out = tmp_path / "t.json"
    r = CliRunner().invoke(main, ["trace", "gen", "deepseek-r1", *args, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest


def test_trace_gen_model_takes_a_name_or_a_config(tmp_path):
    out = tmp_path / "t.json"
    r = CliRunner().invoke(main, ["trace", "gen", "model", str(TINY), "-s", "mini", "--ep", "4", "--tokens-per-die",
                                  "8", "-o", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["cmemu.generator"]["name"] == "model" and doc["cmemu.generator"]["experts_per_die"] == 2
    r = CliRunner().invoke(main, ["trace", "gen", "model", "qwen3-30b-a3b", "--mtp", "-o", str(out)])
    assert r.exit_code == 2 and "no MTP module" in r.output
    r = CliRunner().invoke(main, ["trace", "gen", "model", str(tmp_path / "none.json"), "-o", str(out)])
    assert r.exit_code == 2 and "none.json: cannot read the model config" in r.output


def test_the_tiny_model_runs_and_the_scenarios_take_it(tmp_path):
    from cmemu.scenarios import run_scenario

    params, tables = run_scenario("decode", "mini", model_name=str(TINY), ep=4, tokens_per_die=8, layers=3,
                                  fabric="message")
    step = tables["decode step"][0]
    assert params["model"] == str(TINY) and params["mtp"] is False
    assert step["tpot_ms"] > 0 and step["per_layer_time_us"] > 0
    assert "attn_prolog_us" in tables["mean busy time per die by op class (us)"][0]
    params, tables = run_scenario("prefill", "mini", model_name=str(TINY), ep=4, attn_tp=2, requests=4, prompt_len=64,
                                  layers=2, fabric="message")
    step = tables["prefill step"][0]
    assert step["ttft_ms"] > 0 and step["ttft_3_layers_extrapolated_ms"] > step["ttft_ms"]


def test_decode_attention_tensor_parallel_shapes_by_hand():
    m = read_config(TINY)
    d = DecodeDeployment(ep=4, tokens_per_die=6, kv_len=100, micro_batches=2, experts_per_die=2, layers=3, attn_tp=2)
    doc = decode_step(m, d, "mini", 32)
    assert doc["groups"]["tp0"] == [0, 1] and doc["groups"]["tp1"] == [2, 3]
    a = {k: v["attrs"] for k, v in _nodes(doc).items()}
    # A group of 2 dies serves its 2 x 3 tokens per micro-batch; each die has 2 of the 4 query
    # heads and 1 of the 2 K/V heads: q/k/v (2 + 2 x 1) x 16 values.
    assert (a["qkv_proj"]["cmemu.m"], a["qkv_proj"]["cmemu.n"]) == (6, 64)
    att = a["attention"]
    assert (att["cmemu.tokens"], att["cmemu.heads"], att["cmemu.kv_heads"]) == (6, 2, 1)
    assert (a["o_proj"]["cmemu.m"], a["o_proj"]["cmemu.k"]) == (6, 32)  # a partial sum of the 2 heads
    assert (a["attn_reduce"]["comm_type"], a["attn_reduce"]["cmemu.group"], a["attn_reduce"]["comm_size"]) == \
        ("ALL_REDUCE", "tp0", 6 * 64 * 2)
    # The MoE on the die's own 3 tokens, gathered back over the group after the combine.
    assert a["gate"]["cmemu.m"] == 3 and a["dispatch"]["cmemu.tokens"] == 3
    assert (a["moe_gather"]["comm_type"], a["moe_gather"]["comm_size"]) == ("ALL_GATHER", 3 * 64 * 2)
    # The dense layer: the FFN's 96 split over the 2 dies, all-reduced.
    f = {k: v["attrs"] for k, v in _nodes(doc, layer="L0.mb0").items()}
    assert (f["ffn_up"]["cmemu.m"], f["ffn_up"]["cmemu.n"], f["ffn_down"]["cmemu.k"]) == (6, 96, 48)
    assert f["ffn_reduce"]["comm_size"] == 6 * 64 * 2
    with pytest.raises(CmemuError, match="--attn-tp 3"):
        decode_step(m, DecodeDeployment(ep=6, attn_tp=3, tokens_per_die=6), "mini", 32)


@pytest.mark.parametrize("preset_args, model_args", [
    # At CloudMatrix-Infer's EP320 the generator's defaults are the preset's: 1 slot per die,
    # the shared expert in the EP group, 16 + 8 AIC, MTP (the model has it).
    (["--layers", "2"], ["--layers", "2"]),
    # The preset's 10 slots per die at EP32 (8 routed, the shared one, a redundant one) are its
    # own choice: the generator's default would be the 9 that 257 experts need.
    # (The reused KV already in HBM: the EMS fetch is a pass of the preset's, issue 21.)
    (["--phase", "prefill", "--layers", "4", "--reuse", "0.25", "--ems-plane", "hbm"],
     ["--phase", "prefill", "--layers", "4", "--reuse", "0.25", "--experts-per-die", "10"]),
])
def test_the_preset_is_the_model_generator_with_cloudmatrix_infer_defaults(tmp_path, preset_args, model_args):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert CliRunner().invoke(main, ["trace", "gen", "deepseek-r1", *preset_args, "-o", str(a)]).exit_code == 0
    r = CliRunner().invoke(main, ["trace", "gen", "model", "deepseek-r1", *model_args, "-o", str(b)])
    assert r.exit_code == 0, r.output
    da, db = json.loads(a.read_text()), json.loads(b.read_text())
    assert da["nodes"] == db["nodes"] and da["groups"] == db["groups"]
    assert da["cmemu.generator"]["name"] == "deepseek-r1" and db["cmemu.generator"]["name"] == "model"


def test_hbm_footprint_per_die_by_hand(tmp_path):
    """DeepSeek-R1 in CloudMatrix-Infer's decode deployment (EP320, one expert slot, 96 tokens
    per die with MTP: 48 requests, KV 4096, INT8 weights), by hand from its config."""
    m = load_model("deepseek-r1")
    h, H = 7168, 128
    attn = (h * 1536 + 1536 + 1536 * H * 192) + (h * 576 + 512 + 512 * H * 256) + H * 128 * h
    weights = (61 * attn + 3 * 3 * h * 18432  # attention; the 3 dense layers' FFNs
               + 58 * (h * 256 + 3 * h * 2048)  # router + one expert slot
               + 2 * 129280 * h)  # embedding and LM head, 1 B each
    kv = 48 * 4096 * 576 * 2 * 61  # latent 512 + rope key 64, BF16, every layer
    d = DecodeDeployment(ep=320, tokens_per_die=96, kv_len=4096, mtp=True, layers=2)
    assert d.hbm_per_die_byte(m) == (weights, kv)
    # trace gen says it, and says when it does not fit the die's 64 GB
    out = CliRunner().invoke(main, ["trace", "gen", "deepseek-r1", "--system", "cloudmatrix384", "--layers", "2",
                                    "-o", str(tmp_path / "a.json")])
    assert out.exit_code == 0, out.output
    assert f"per die {weights / 1e9:,.1f} GB of weights + {kv / 1e9:,.1f} GB of KV cache of 64 GB HBM" in out.output
    assert "NOT fit" not in out.output
    out = CliRunner().invoke(main, ["trace", "gen", "deepseek-r1", "--system", "cloudmatrix384", "--layers", "2",
                                    "--kv-len", "16384", "-o", str(tmp_path / "b.json")])
    assert "does NOT fit" in out.output
