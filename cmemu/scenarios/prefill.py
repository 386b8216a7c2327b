"""prefill: one prefill step, simulated: DeepSeek-R1 in CloudMatrix-Infer (cmemu.trace.deepseek)
by default, or any model (``--model NAME|CONFIG.json``: cmemu.models.step).

Reports, from the simulated timeline (nothing is taken from the paper):
- TTFT: the prefill step time, until the last op of the step ends (all dies, both micro-batches,
  the LM head of every request's last token included); queueing before the step is not counted;
- per-layer time: layer i's time is the end of its last op (any die) minus the end of layer
  i - 1's; the figures are the last simulated MoE layer's and the last dense layer's;
- throughput: prompt tokens per second per NPU (two dies): prompt length x requests / TTFT /
  (EP / 2); reused (context-cache) tokens count as prompt tokens, as a user sees them;
- a breakdown by op class (per die, mean busy time of each class, streams counted separately);
- exposed communication: per die, the time a collective (attention all-gather or all-to-all,
  MoE dispatch or combine) is in progress while no compute op runs on that die (the KV fetch,
  a memory transfer, is neither).
With fewer than 61 layers (``--layers``), TTFT and tokens/s are also given extrapolated to the
full model (3 dense + 58 MoE layers) from the last simulated dense and MoE layer times, and
marked so (this needs one of each: two layers or more).
"""
from __future__ import annotations

import click
import numpy as np

from cmemu.errors import CmemuError
from cmemu.results.overlap import exposed_comm_by_class_ps
from cmemu.scenarios.common import run_doc, run_options, scenario_command
from cmemu.trace.deepseek import PrefillConfig
from cmemu.trace.ems_fetch import prefill_step
from cmemu.trace.read import gc_paused
from cmemu.workload.deepseek import DENSE_LAYERS, LAYERS

CLASSES = (
    ("mla_prolog_sp", ("rmsnorm_in", "q_down", "rmsnorm_q", "kv_down", "rmsnorm_kv", "rope_k")),
    ("attn_gather", ("attn_gather",)),
    ("kv_fetch", ("kv_fetch",)),
    ("ems_fetch", ("ems_fetch", "ssd_read")),
    ("ems_gather", ("ems_gather",)),
    ("mla_prolog_tp", ("q_up", "kv_up", "rope_q")),
    ("attention", ("attention",)),
    ("attn_a2a", ("attn_a2a",)),
    ("o_proj", ("o_proj",)),
    ("dense_ffn", ("rmsnorm_ffn", "ffn_up", "swiglu", "ffn_down")),
    ("gate", ("gate",)),
    ("dispatch", ("dispatch",)),
    ("expert_mlp", ("expert_up", "expert_swiglu", "expert_down")),
    ("combine", ("combine",)),
    ("sampling", ("lm_head", "softmax")),
    ("kv_transfer", ("kv_send", "kv_recv")),
    ("shared_expert", ("shared_ffn_up", "shared_swiglu", "shared_ffn_down")),
)
# A GQA model's: the SP stage is the input RMSNorm alone; the TP stage the q/k/v projection of the
# die's heads, their q/k norms and RoPE.
GQA_CLASSES = tuple(
    ("attn_prolog_sp", ("rmsnorm_in",)) if cls == "mla_prolog_sp"
    else ("attn_prolog_tp", ("qkv_proj", "rmsnorm_qk", "rope_qk")) if cls == "mla_prolog_tp"
    else (cls, leaves) for cls, leaves in CLASSES)
COMM_CLASSES = ("attn_gather", "attn_a2a", "dispatch", "combine")
_CLASS_OF = {leaf: cls for cls, leaves in CLASSES for leaf in leaves}
_GQA_CLASS_OF = {leaf: cls for cls, leaves in GQA_CLASSES for leaf in leaves}


def _class_of(name: str, table=_CLASS_OF) -> str:
    return table.get(name.rsplit(".", 1)[-1], "other")


def layer_times_ps(cfg: PrefillConfig, result) -> list[int]:
    """Each simulated layer's time: the end of its last op minus the end of the layer before."""
    names = result.lowered.op_name
    end = result.op_end_ps
    layer = np.array([int(n[1:n.index(".")]) if n.startswith("L") else -1 for n in names])
    ends = [int(end[layer == i].max()) for i in range(cfg.layers)]
    return [e - p for e, p in zip(ends, [0] + ends[:-1])]


def prefill_metrics(cfg: PrefillConfig, result, model=None) -> tuple[dict, dict]:
    """The step's figures (module docstring); ``model`` None: DeepSeek-R1 (cmemu.trace.deepseek),
    else ``cfg`` is a cmemu.models.step.PrefillDeployment of ``model``."""
    names = result.lowered.op_name
    start, end = result.op_start_ps, result.op_end_ps
    rank = result.lowered.op_rank
    gqa = model is not None and model.attention == "gqa"
    classes = np.array([_class_of(n, _GQA_CLASS_OF if gqa else _CLASS_OF) for n in names])
    step_ps = int(end[classes != "kv_transfer"].max())  # the first token is out before the KV moves on
    if model is None:
        dense_sim, dense_all, total = cfg.dense_layers, DENSE_LAYERS, LAYERS
    else:
        from cmemu.models.step import dense_layers_of

        dense_sim, dense_all, total = dense_layers_of(model, cfg.layers), model.dense_first_layers, model.layers
    per_class = {}
    for cls, _ in GQA_CLASSES if gqa else CLASSES:
        m = classes == cls
        if m.any():
            per_class[f"{cls}_us"] = round(float((end[m] - start[m]).sum()) / cfg.ep / 1e6, 2)
    times = layer_times_ps(cfg, result)
    dense_ps = times[dense_sim - 1] if dense_sim else None
    moe_ps = times[-1] if cfg.layers > dense_sim else None
    is_comm = np.isin(classes, COMM_CLASSES)
    is_compute = ~is_comm & ~np.isin(classes, ("kv_fetch", "ems_fetch", "ems_gather"))
    ems = classes == "ems_gather"
    if ems.any() and dense_sim < 2:
        dense_ps = None  # layer 0 waits for the EMS fetch: its time is no dense layer's (simulate 3 layers)
    exposed = exposed_comm_by_class_ps(rank, is_comm, is_compute, start, end, cfg.ep)
    npus = cfg.ep / 2
    tokens = cfg.prompt_tokens_per_step
    out = {
        "prompt_tokens_per_step": tokens, "new_tokens_per_step": cfg.new_tokens * cfg.requests,
        "layers_simulated": cfg.layers,
        "ttft_ms": round(step_ps / 1e9, 3),
        "moe_layer_time_us": round(moe_ps / 1e6, 1) if moe_ps else None,
        "dense_layer_time_us": round(dense_ps / 1e6, 1) if dense_ps else None,
        "tokens_per_s_per_npu": round(tokens / (step_ps / 1e12) / npus, 1),
        "exposed_comm_us": round(float(np.mean(exposed)) / 1e6, 1),
    }
    if ems.any():
        out["ems_prefix_in_hbm_ms"] = round(int(end[ems].max()) / 1e9, 3)
    dense_left, moe_left = dense_all - dense_sim, total - dense_all - (cfg.layers - dense_sim)
    if cfg.layers < total and (dense_ps or not dense_left) and (moe_ps or not moe_left):
        full_ps = step_ps + dense_left * (dense_ps or 0) + moe_left * (moe_ps or 0)
        out[f"ttft_{total}_layers_extrapolated_ms"] = round(full_ps / 1e9, 3)
        out[f"tokens_per_s_per_npu_{total}_layers_extrapolated"] = round(tokens / (full_ps / 1e12) / npus, 1)
    return out, per_class


def run_prefill(spec, cfg: PrefillConfig, fabric: str = "packet", max_memory: int | None = None, model=None,
                ems_plane="hbm", pool_nodes=None, kv_transfer=False, decode_dp=320, layerwise=False):
    """(step metrics, busy time by op class, KV arrivals or None) of one simulated step:
    DeepSeek-R1 in CloudMatrix-Infer (``model`` None; with its EMS fetch and KV transfer,
    cmemu.trace.ems_fetch.prefill_step) or ``model`` (``cfg`` a PrefillDeployment). With
    ``kv_transfer`` the step is simulated twice: its figures from the step alone, the arrivals
    from the step with the transfers. In a cut-down trace the transfers leave during the last
    simulated layer, which stands for every MoE layer in the extrapolation (in the whole model
    they overlap the last layer only); the first token does not wait for them."""
    if model is not None:
        if kv_transfer or (cfg.reuse and ems_plane != "hbm"):
            raise CmemuError(f"--model {model.name}: the EMS fetch and the KV transfer are modelled for deepseek-r1 "
                             "(CloudMatrix-Infer's deployment) only; use --ems-plane hbm")
        from cmemu.models.step import prefill_step as model_prefill_step

        with gc_paused():  # as cmemu.trace.deepseek.prefill_trace
            doc = model_prefill_step(model, cfg, spec.name, spec.dies)
        metrics, per_class = prefill_metrics(cfg, run_doc(doc, spec, fabric_model=fabric, max_memory_bytes=max_memory),
                                             model)
        return metrics, per_class, None
    cfg, doc = prefill_step(cfg, spec, ems_plane, pool_nodes, False, decode_dp, layerwise)
    metrics, per_class = prefill_metrics(cfg, run_doc(doc, spec, fabric_model=fabric, max_memory_bytes=max_memory))
    if ems_plane != "hbm" and cfg.reused_tokens:
        metrics = {"reused_tokens_per_prompt": cfg.reused_tokens, **metrics}
    arrivals = None
    if kv_transfer:
        cfg, doc = prefill_step(cfg, spec, ems_plane, pool_nodes, True, decode_dp, layerwise)
        arrivals = kv_arrivals(doc, run_doc(doc, spec, fabric_model=fabric, max_memory_bytes=max_memory))
    return metrics, per_class, arrivals


def kv_arrivals(doc, result) -> list[dict]:
    """When each request's KV cache is in its decode die's HBM (the end of its kv_recv)."""
    names, end = result.lowered.op_name, result.op_end_ps
    send_die = {n["name"].split(".")[1]: n["rank"] for n in doc["nodes"] if n["name"].endswith(".kv_send")}
    rows = []
    for i, name in enumerate(names):
        if name.startswith("kv.") and name.endswith(".kv_recv"):
            req = name.split(".")[1]
            rows.append({"request": int(req[1:]), "from_die": send_die[req], "to_die": int(result.lowered.op_rank[i]),
                         "kv_bytes": int(result.lowered.op_bytes[i]), "arrived_ms": round(int(end[i]) / 1e9, 3)})
    return sorted(rows, key=lambda r: r["request"])


@scenario_command("prefill")
@click.option("--model", "model_name", default="deepseek-r1", show_default=True, metavar="NAME|CONFIG.json",
              help="A shipped model (`cmemu models`) or a Hugging Face config.json; deepseek-r1 is CloudMatrix-Infer's "
                   "own deployment (10 expert slots per die), any other the model step generator's (as many slots "
                   "per die as its experts need at this EP degree).")
@click.option("--ep", type=click.IntRange(min=2), default=32, show_default=True, help="EP degree (dies).")
@click.option("--prompt-len", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Tokens per prompt.")
@click.option("--requests", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests per step (a multiple of micro-batches x EP / attn-tp).")
@click.option("--attn-tp", type=click.IntRange(min=2), default=8, show_default=True,
              help="Dies that split one request's attention heads (the TP stage of SP -> TP -> SP).")
@click.option("--micro-batches", type=click.Choice(["1", "2"]), default="2", show_default=True)
@click.option("--int8/--bf16", default=True, show_default=True, help="Weights and activations of the matmuls.")
@click.option("--reuse", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="EMS context-cache reuse rate: share of each prompt's KV fetched, not recomputed.")
@click.option("--ems-plane", type=click.Choice(["ub", "vpc", "hbm"]), default="ub", show_default=True,
              help="Where the reused KV comes from: the EMS pool over UB or over the VPC plane (rounded down to "
                   "whole blocks), or already in the die's HBM (no fetch).")
@click.option("--pool-nodes", type=click.IntRange(min=1), default=None,
              help="Nodes whose CPUs form the EMS pool [default: all].")
@click.option("--ems-fetch", type=click.Choice(["whole", "layerwise"]), default="whole", show_default=True,
              help="The EMS fetch waited for whole before layer 0, or read and waited for layer by layer.")
@click.option("--kv-transfer", is_flag=True, default=False, help="Send each request's KV to its decode die over RDMA after its "
              "last layer, and report when it arrives.")
@click.option("--decode-dp", type=click.IntRange(min=1), default=320, show_default=True,
              help="With --kv-transfer: decode DP ranks (one die each, after the prefill dies).")
@click.option("--dispatch-engine", type=click.Choice(["sdma", "aiv"]), default="sdma", show_default=True)
@click.option("--skew", type=click.FloatRange(min=0), default=0.0, show_default=True)
@run_options
@click.option("--layers", type=click.IntRange(min=1), default=None,
              help="Layers to simulate (fewer than the model's: TTFT and tokens/s are also extrapolated to all of "
                   "them; DeepSeek-R1's whole step, 61, takes 20-25 s with --fabric message, about 30 s with --fabric "
                   "message-bp, closer to the packet model under incast, and about 45 s on the packet model) "
                   "[default: 2; 3 with an EMS fetch, whose wait is in layer 0, so that a dense layer's time is layer "
                   "1's].")
def command(spec, model_name, ep, prompt_len, requests, attn_tp, micro_batches, int8, reuse, ems_plane, pool_nodes,
            ems_fetch, kv_transfer, decode_dp, dispatch_engine, skew, fabric, max_memory, layers):
    """A prefill step (DeepSeek-R1 in CloudMatrix-Infer: EP32, SP -> TP -> SP attention; or
    --model): TTFT, per-layer time, prompt tokens/s per NPU, time by op class, exposed
    communication."""
    if layers is None:
        layers = 3 if reuse and ems_plane != "hbm" and model_name == "deepseek-r1" else 2
    options = dict(ep=ep, prompt_len=prompt_len, requests=requests, attn_tp=attn_tp, micro_batches=int(micro_batches),
                   reuse=reuse, dispatch_engine=dispatch_engine, skew=skew, layers=layers)
    model = None
    if model_name == "deepseek-r1":
        cfg = PrefillConfig(int8=int8, **options)
    else:
        from cmemu.models.description import load_model
        from cmemu.models.step import prefill_deployment_from_options

        model = load_model(model_name)
        cfg = prefill_deployment_from_options(model, weight_dtype="int8" if int8 else "bf16", **options)
    params = {"model": model_name, "ep": ep, "prompt_len": prompt_len, "requests": requests, "attn_tp": attn_tp,
              "micro_batches": cfg.micro_batches, "dtype": "int8" if int8 else "bf16", "reuse": reuse,
              "dispatch_engine": dispatch_engine, "layers": layers, "fabric": fabric}
    if reuse:
        params["ems_plane"] = ems_plane
        if ems_plane != "hbm":
            params["ems_fetch"] = ems_fetch
    metrics, per_class, arrivals = run_prefill(spec, cfg, fabric, max_memory, model, ems_plane, pool_nodes, kv_transfer,
                                               decode_dp, ems_fetch == "layerwise")
    tables = {"prefill step": [metrics], "mean busy time per die by op class (us)": [per_class]}
    if arrivals is not None:
        params["decode_dp"] = decode_dp
        tables["KV cache at its decode die (RDMA)"] = arrivals
    return params, tables
