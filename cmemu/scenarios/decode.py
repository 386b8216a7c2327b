"""decode: one decode step, simulated: DeepSeek-R1 in CloudMatrix-Infer (cmemu.trace.deepseek) by
default, or any model (``--model NAME|CONFIG.json``: cmemu.models.step, the same deployment's
shape with as many expert slots per die as its experts need).

Reports, from the simulated timeline (nothing is taken from the paper):
- step time: the last op of the step ends (all dies, both micro-batches);
- per-layer time: the mean time between successive MoE layers' ends on die 0 (the MTP layer
  counts: it is a MoE layer too), a steady-state figure that needs two MoE layers;
- TPOT: step time / tokens a request gains per step (1, plus the MTP acceptance rate);
- throughput: decoded tokens per second per NPU (two dies);
- a breakdown by op class (per die, mean busy time of each class, streams counted separately);
- exposed communication: per die, the time a MoE dispatch or combine is in progress while no
  compute op runs on that die;
- per stream and micro-batch, the busy time per MoE layer (mean over dies of the time its ops run,
  a collective from its start to its end): stream 0 holds every micro-batch's attention (MLAProlog,
  attention, output projection), stream 1 their MoE part (gate, dispatch, expert MLP, combine);
  a layer takes at least the busier stream's total, which bounds it.
``--micro-batches 1,2`` runs both and reports the throughput gain of two micro-batches over one.
With fewer than the model's layers (``--layers``; 61 for DeepSeek-R1), the step and TPOT are also
given extrapolated to the full model from the simulated per-layer time, and marked so (the keys
name the model's layer count, and again ``all_layers`` for sweeps over models).
``--tpot-slo MS`` searches the largest tokens per die whose TPOT meets the SLO: from
``--tokens-per-die``, doubling while it meets it (at most MAX_SLO_DOUBLINGS times), then bisection
between the largest size that met it and the smallest that missed, until they are one apart
(each a simulated run); the answer says whether it is exact or, where no size missed, a lower
bound.
"""
from __future__ import annotations

import click
import numpy as np

from cmemu.errors import CmemuError
from cmemu.results.overlap import exposed_comm_by_class_ps
from cmemu.scenarios.common import run_doc, run_options, scenario_command
from cmemu.trace.deepseek import DecodeConfig, decode_trace
from cmemu.trace.read import gc_paused
from cmemu.workload.deepseek import LAYERS

CLASSES = (
    ("attention", ("attention",)),
    ("mla_prolog", ("rmsnorm_in", "q_down", "q_up", "kv_down", "rmsnorm_kv", "rope", "absorb_uk")),
    ("attention_out", ("absorb_uv", "o_proj")),
    ("dense_ffn", ("rmsnorm_ffn", "ffn_up", "swiglu", "ffn_down")),
    ("gate", ("gate",)),
    ("dispatch", ("dispatch",)),
    ("expert_mlp", ("expert_up", "expert_swiglu", "expert_down")),
    ("combine", ("combine",)),
    ("sampling", ("lm_head", "softmax")),
    ("shared_expert", ("shared_ffn_up", "shared_swiglu", "shared_ffn_down")),
    ("tp_collectives", ("attn_reduce", "ffn_reduce", "moe_gather")),
)
# A GQA model's attention prologue: input RMSNorm, fused q/k/v projection, q/k norms, RoPE.
GQA_CLASSES = tuple(("attn_prolog", ("rmsnorm_in", "qkv_proj", "rmsnorm_qk", "rope")) if cls == "mla_prolog"
                    else (cls, leaves) for cls, leaves in CLASSES)


def _classes(model) -> tuple:
    return GQA_CLASSES if model is not None and model.attention == "gqa" else CLASSES


def _class_of(name: str, classes=CLASSES) -> str:
    leaf = name.rsplit(".", 1)[-1]
    for cls, leaves in classes:
        if leaf in leaves:
            return cls
    return "other"


def _per_name(names, fn, dtype) -> np.ndarray:
    """``fn`` of each op's name, as an array of ``dtype``, with ``fn`` called once per distinct
    name: a step repeats each name on every die (the 61-layer step's 670,000 ops have 2,100
    names; per op, these passes took 1 s)."""
    index = {}
    code = np.fromiter((index.setdefault(n, len(index)) for n in names), np.intp, len(names))
    return np.array([fn(n) for n in index], dtype=dtype)[code]


def _layer_shape(cfg, model) -> tuple[int, int, bool]:
    """(dense layers simulated, the model's layers, whether it has MoE layers) of a step: the
    DeepSeek-R1 preset's (``model`` None) or any model's (cmemu.models)."""
    if model is None:
        return cfg.dense_layers, LAYERS, True
    from cmemu.models.step import dense_layers_of

    return dense_layers_of(model, cfg.layers), model.layers, model.moe


def stream_busy(cfg: DecodeConfig, result, model=None) -> list[dict]:
    """Busy time per MoE layer (a dense model's: per layer) of each (micro-batch, stream), mean
    over dies (module docstring)."""
    L = result.lowered
    names = L.op_name
    dur = (result.op_end_ps - result.op_start_ps).astype(np.float64)
    dense, _, moe = _layer_shape(cfg, model)
    moe_layers = [f"L{i}" for i in range(dense if moe else 0, cfg.layers)] + (["MTP"] if cfg.mtp else [])
    in_moe = _per_name(names, lambda n: n.split(".", 1)[0] in moe_layers, bool)
    mb_of = _per_name(names, lambda n: int(n.split(".", 2)[1][2:]) if n.count(".") >= 2
                      and n.split(".", 2)[1].startswith("mb") else -1, np.int_)
    stream = L.op_stream
    rows, totals = [], {}
    n = max(1, len(moe_layers)) * cfg.ep
    for mb in range(cfg.micro_batches):
        for st in (0, 1):
            m = in_moe & (mb_of == mb) & (stream == st)
            busy = float(dur[m].sum()) / n
            totals[st] = totals.get(st, 0.0) + busy
            rows.append({"micro_batch": mb, "stream": st, "work": "attention" if st == 0 else "moe",
                         "busy_per_layer_us": round(busy / 1e6, 1)})
    bound = max(totals, key=totals.get) if totals else None
    for st, busy in totals.items():
        rows.append({"micro_batch": "all", "stream": st, "work": "attention" if st == 0 else "moe",
                     "busy_per_layer_us": round(busy / 1e6, 1), "bounds_the_layer": st == bound})
    return rows


def decode_metrics(cfg: DecodeConfig, result, model=None) -> dict:
    """The step's figures (module docstring); ``model`` None: DeepSeek-R1 (cmemu.trace.deepseek)."""
    L = result.lowered
    names = L.op_name
    start, end = result.op_start_ps, result.op_end_ps
    rank = L.op_rank
    step_ps = int(end.max())
    table = _classes(model)
    classes = [cls for cls, _ in table]
    # Each op's class as its index in the table (len(table): "other").
    class_of = _per_name(names, lambda n: (classes + ["other"]).index(_class_of(n, table)), np.int_)
    per_class = {}
    dies = cfg.ep
    _, total_layers, moe = _layer_shape(cfg, model)
    for k, cls in enumerate(classes):
        m = class_of == k
        if m.any():
            per_class[f"{cls}_us"] = round(float((end[m] - start[m]).sum()) / dies / 1e6, 2)
    # Steady-state layer time: successive MoE layers' combine ends on die 0, last micro-batch
    # (a dense model's: successive layers' FFN ends).
    mb_last = cfg.micro_batches - 1
    leaf = "combine" if moe else "ffn_down"
    ends = end[(rank == 0) & _per_name(names, lambda n: n.endswith(f".mb{mb_last}.{leaf}"), bool)]  # the MTP one too
    layer_ps = int(np.diff(ends).mean()) if len(ends) >= 2 else None
    is_comm = np.isin(class_of, [classes.index(cls) for cls in ("dispatch", "combine", "tp_collectives")])
    exposed = exposed_comm_by_class_ps(rank, is_comm, ~is_comm, start, end, dies)
    accepted = cfg.accepted_per_step
    out = {
        "tokens_per_die": cfg.tokens_per_die, "micro_batches": cfg.micro_batches, "layers_simulated": cfg.layers,
        "step_time_us": round(step_ps / 1e6, 1),
        "per_layer_time_us": round(layer_ps / 1e6, 1) if layer_ps else None,
        "tpot_ms": round(step_ps / 1e9 / accepted, 3),
        "tokens_per_s_per_npu": round(2 * cfg.requests_per_die * accepted / (step_ps / 1e12), 1),
        "exposed_comm_us": round(float(np.mean(exposed)) / 1e6, 1),
    }
    if cfg.layers < total_layers and layer_ps:
        full_ps = step_ps + (total_layers - cfg.layers) * layer_ps
        n = total_layers
        out[f"step_time_{n}_layers_extrapolated_us"] = round(full_ps / 1e6, 1)
        out[f"tpot_{n}_layers_extrapolated_ms"] = round(full_ps / 1e9 / accepted, 3)
        out[f"tokens_per_s_per_npu_{n}_layers_extrapolated"] = round(
            2 * cfg.requests_per_die * accepted / (full_ps / 1e12), 1)
        # The same under names that do not depend on the model (sweeps over models).
        out["tpot_all_layers_extrapolated_ms"] = out[f"tpot_{n}_layers_extrapolated_ms"]
        out["tokens_per_s_per_npu_all_layers_extrapolated"] = out[f"tokens_per_s_per_npu_{n}_layers_extrapolated"]
    return out, per_class, stream_busy(cfg, result, model)


def run_decode(spec, cfg: DecodeConfig, fabric: str = "packet", max_memory: int | None = None, model=None):
    """(step metrics, busy time by op class, busy time per stream) of one simulated step: of
    DeepSeek-R1 in CloudMatrix-Infer (``cfg`` a DecodeConfig, ``model`` None) or of ``model``
    (``cfg`` a cmemu.models.step.DecodeDeployment)."""
    if model is None:
        def generate():
            return decode_trace(cfg, spec.name, spec.dies)
    else:
        from cmemu.models.step import decode_step

        def generate():
            with gc_paused():  # as decode_trace
                return decode_step(model, cfg, spec.name, spec.dies)
    # The document goes to the run with no reference left here: the run frees it once checked.
    return decode_metrics(cfg, run_doc(generate(), spec, fabric_model=fabric, max_memory_bytes=max_memory), model)


MAX_SLO_DOUBLINGS = 6  # --tpot-slo's reach: 64x the starting tokens per die


@scenario_command("decode")
@click.option("--model", "model_name", default="deepseek-r1", show_default=True, metavar="NAME|CONFIG.json",
              help="A shipped model (`cmemu models`) or a Hugging Face config.json; deepseek-r1 is CloudMatrix-Infer's "
                   "own deployment (cmemu.trace.deepseek), any other the model step generator's (one expert slot "
                   "per die or as many as its experts need, the same streams and cores).")
@click.option("--ep", type=click.IntRange(min=2), default=None, help="EP degree [default: 320, or all dies if fewer].")
@click.option("--tokens-per-die", type=click.IntRange(min=1), default=96, show_default=True)
@click.option("--kv-len", type=click.IntRange(min=1), default=4096, show_default=True)
@click.option("--micro-batches", default="2", show_default=True,
              help="1, 2, or 1,2: both, with the gain of two over one.")
@click.option("--mtp/--no-mtp", default=True, show_default=True,
              help="Multi-token prediction: the model's MTP module, where it has one (--model without one: off).")
@click.option("--mtp-acceptance", type=click.FloatRange(0, 1), default=0.7, show_default=True)
@click.option("--dispatch-engine", type=click.Choice(["aiv", "sdma"]), default="aiv", show_default=True)
@click.option("--skew", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--attn-tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --model: dies that split the attention heads and a dense FFN (all-reduced; the MoE runs on "
                   "each die's own tokens); 1: data-parallel attention, as CloudMatrix-Infer's.")
@click.option("--lm-head-tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Dies sharing the LM head's vocabulary (all-gather, then all-to-all of the logits); 1: every "
                   "die holds the whole head (the default, as CloudMatrix-Infer's DP decode).")
@run_options
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Layers to simulate (the step and TPOT are also extrapolated to all the model's).")
@click.option("--tpot-slo", type=click.FloatRange(min=0, min_open=True), default=None, metavar="MS",
              help="Find the largest tokens per die whose (extrapolated) TPOT meets this SLO.")
def command(spec, model_name, ep, tokens_per_die, kv_len, micro_batches, mtp, mtp_acceptance, dispatch_engine, skew,
            attn_tp, lm_head_tp, fabric, max_memory, layers, tpot_slo):
    """A decode step (DeepSeek-R1 in CloudMatrix-Infer, or --model): step time, per-layer time,
    TPOT, tokens/s per NPU, busy time per stream and micro-batch, time by op class, exposed
    communication; --micro-batches 1,2 gives the gain of two; --tpot-slo finds the largest batch
    meeting an SLO."""
    from cmemu.models.description import load_model

    ep = ep or min(320, spec.dies)
    preset = model_name == "deepseek-r1"
    model = None if preset else load_model(model_name)
    mtp = bool(mtp and (preset or model.mtp_layers))
    total_layers = LAYERS if preset else model.layers
    try:
        mbs = sorted({int(x) for x in str(micro_batches).split(",") if x.strip()})
    except ValueError:
        raise CmemuError(f"--micro-batches must be 1, 2 or 1,2, got {micro_batches!r}") from None
    if not mbs or any(m not in (1, 2) for m in mbs):
        raise CmemuError(f"--micro-batches must be 1, 2 or 1,2, got {micro_batches!r}")
    if tpot_slo is not None and len(mbs) > 1:
        raise CmemuError("--tpot-slo searches with one --micro-batches setting: give 1 or 2, not 1,2")

    def cfg_for(tokens, mb=mbs[-1]):
        options = dict(ep=ep, tokens_per_die=tokens, kv_len=kv_len, micro_batches=mb, mtp=mtp,
                       mtp_acceptance=mtp_acceptance, dispatch_engine=dispatch_engine, skew=skew, layers=layers,
                       lm_head_tp=lm_head_tp)
        if preset:
            if attn_tp != 1:
                raise CmemuError("--attn-tp: the deepseek-r1 preset is CloudMatrix-Infer's data-parallel attention; "
                                 "give the path of its config (cmemu/models/configs/deepseek-r1.json) as --model "
                                 "to deploy it otherwise")
            return DecodeConfig(**options)
        from cmemu.models.step import decode_deployment_from_options

        return decode_deployment_from_options(model, spec.dies, attn_tp=attn_tp, **options)

    params = {"model": model_name, "ep": ep, "kv_len": kv_len, "micro_batches": ",".join(map(str, mbs)), "mtp": mtp,
              "mtp_acceptance": mtp_acceptance, "dispatch_engine": dispatch_engine, "lm_head_tp": lm_head_tp,
              "attn_tp": attn_tp, "layers": layers, "fabric": fabric}
    if tpot_slo is None:
        steps, classes, streams = [], [], []
        for mb in mbs:
            metrics, per_class, busy = run_decode(spec, cfg_for(tokens_per_die, mb), fabric, max_memory, model)
            steps.append(metrics)
            classes.append({"micro_batches": mb, **per_class})
            streams += [{"micro_batches": mb, **row} for row in busy]
        tables = {"decode step": steps, "busy time per MoE layer by stream and micro-batch (us)": streams,
                  "mean busy time per die by op class (us)": classes}
        if len(steps) == 2:
            one, two = steps
            extrapolated = f"tokens_per_s_per_npu_{total_layers}_layers_extrapolated"
            key = extrapolated if extrapolated in one else "tokens_per_s_per_npu"
            tables["gain of two micro-batches over one"] = [{
                "tokens_per_die": tokens_per_die, "throughput_gain_pct": round(100 * (two[key] / one[key] - 1), 1),
                "step_time_one_us": one["step_time_us"], "step_time_two_us": two["step_time_us"],
                "basis": key}]
        return params, tables
    key = f"tpot_{total_layers}_layers_extrapolated_ms" if layers < total_layers else "tpot_ms"
    rows = []
    lo, hi = 0, None  # the largest tokens per die found to meet the SLO, the smallest found to miss it
    tokens = tokens_per_die
    best = None
    doublings = 0
    while tokens >= mbs[0] and (hi is None or hi - lo > 1):
        metrics, _, _ = run_decode(spec, cfg_for(tokens), fabric, max_memory, model)
        if metrics.get(key) is None:
            # (The per-layer time is the time between two successive layers' ends: with fewer,
            # the step's TPOT over the model's layers is unknown.)
            raise CmemuError(f"--tpot-slo: the TPOT of all {total_layers} layers cannot be extrapolated from "
                             f"{layers} simulated layer(s), which hold fewer than two layers to time; give "
                             f"more --layers (two of its MoE layers or more), or all {total_layers}")
        rows.append(metrics)
        if metrics[key] <= tpot_slo:
            best, lo = metrics, tokens
            if hi is None:
                if doublings == MAX_SLO_DOUBLINGS:
                    break
                doublings += 1
                tokens *= 2
            else:
                tokens = (lo + hi) // 2
        else:
            hi = tokens
            tokens = (lo + hi) // 2
    if best is None:
        raise CmemuError(f"no tokens per die down to {max(lo, 1)} meets a TPOT of {tpot_slo} ms")
    params["tpot_slo_ms"] = tpot_slo
    params["largest_tokens_per_die_meeting_slo"] = best["tokens_per_die"]
    # Exact when the next size up was run and missed; else a lower bound (the search's reach).
    params["smallest_tokens_per_die_missing_slo"] = hi
    if hi is None:
        params["search"] = (f"a lower bound: every size tried up to {lo} tokens per die met the SLO, and the "
                            f"search goes no further than {2 ** MAX_SLO_DOUBLINGS}x the starting --tokens-per-die")
    else:
        params["search"] = f"exact: {lo} tokens per die meet the SLO, {hi} miss it"
    return params, {"runs": rows}
