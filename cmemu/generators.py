"""The trace generators, by name: what `cmemu trace gen NAME` offers and what a sweep's
``generator = NAME`` runs. Each has its options (cmemu.options.Option) and a ``build(spec,
**options)`` that returns the trace document (docs/trace-format.md) and a line saying what it
holds; the CLI adds ``--system``/``--set`` and ``-o`` and writes the document
(cmemu.trace.writer), a sweep writes it into the point's folder.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import click

from cmemu.options import Option


@dataclass(frozen=True)
class Generator:
    name: str
    help: str
    options: tuple[Option, ...]
    build: Callable  # build(spec, **options) -> (trace document, what it holds)
    system_options_at: int = 0  # where --system and --set go among the options (their place in --help)

    def params(self) -> dict:
        """The click parameters of the options, by Python name."""
        return {o.name: o.param() for o in self.options}


def _deepseek_r1(spec, phase, ep, tokens_per_die, kv_len, prompt_len, requests, attn_tp, reuse, ems_plane, pool_nodes,
                 ems_fetch, kv_transfer, decode_dp, micro_batches, mtp, mtp_acceptance, int8, dispatch_engine, skew,
                 layers, seed, lm_head_tp):
    from cmemu.trace.deepseek import DecodeConfig, PrefillConfig, decode_deployment, decode_trace, preset_model
    from cmemu.trace.ems_fetch import prefill_step

    if phase == "prefill":
        cfg = PrefillConfig(ep=ep or 32, prompt_len=prompt_len, requests=requests, attn_tp=attn_tp,
                            micro_batches=int(micro_batches), int8=int8, reuse=reuse,
                            dispatch_engine=dispatch_engine or "sdma", skew=skew, layers=layers, seed=seed)
        cfg, doc = prefill_step(cfg, spec, ems_plane, pool_nodes, kv_transfer, decode_dp, ems_fetch == "layerwise")
        what = f"{cfg.requests} request(s) x {cfg.prompt_len} tokens"
        if cfg.reused_tokens:
            what += f", {cfg.reused_tokens} reused ({'in HBM' if ems_plane == 'hbm' else 'EMS over ' + ems_plane.upper()})"
    else:
        cfg = DecodeConfig(ep=ep or min(320, spec.dies), tokens_per_die=tokens_per_die, kv_len=kv_len,
                           micro_batches=int(micro_batches), mtp=mtp, mtp_acceptance=mtp_acceptance, int8=int8,
                           dispatch_engine=dispatch_engine or "aiv", skew=skew, layers=layers, seed=seed,
                           lm_head_tp=lm_head_tp)
        doc = decode_trace(cfg, spec.name, spec.dies)
        what = f"{cfg.tokens_per_die} tokens/die" + hbm_fit(decode_deployment(cfg).hbm_per_die_byte(preset_model()), spec)
    return doc, f"{phase}, {cfg.layers} layer(s), EP{cfg.ep}, {what}"


def _o(*decls, **settings) -> Option:
    return Option(decls, settings)


@dataclass(frozen=True)
class Argument:
    """A positional argument of a generator, declared as an Option is (``name`` its Python name)."""

    name: str
    settings: dict

    def option(self):
        return click.argument(self.name, **self.settings)

    def param(self) -> click.Argument:
        return click.Argument([self.name], **self.settings)


def _model(spec, model_name, phase, **options):
    from cmemu.models.description import load_model
    from cmemu.models.step import model_step_from_options
    from cmemu.trace.read import gc_paused

    model = load_model(model_name)
    with gc_paused():  # as cmemu.trace.deepseek's generators
        doc, d = model_step_from_options(model, phase, spec, micro_batches=int(options.pop("micro_batches")), **options)
    what = f"{d.tokens_per_die} tokens/die" if phase == "decode" else f"{d.requests} request(s) x {d.prompt_len} tokens"
    if phase == "decode":
        what += hbm_fit(d.hbm_per_die_byte(model), spec)
    return doc, (f"{model.name} {phase}, {d.layers} layer(s), EP{d.ep}, {d.experts_per_die} expert slot(s)/die, "
                 f"{what}")


def hbm_fit(footprint, spec) -> str:
    """What a decode deployment holds per die against the die's HBM, for trace gen's line."""
    weights, kv = footprint
    cap = spec.die.hbm_capacity_gbyte * 1e9
    text = f"; per die {weights / 1e9:,.1f} GB of weights + {kv / 1e9:,.1f} GB of KV cache of {cap / 1e9:,.0f} GB HBM"
    if weights + kv > cap:
        text += " (does NOT fit: fewer tokens per die, a shorter KV, more EP or attention TP)"
    return text


GENERATORS = {g.name: g for g in (
    Generator(
        "deepseek-r1",
        "One decode or prefill step of DeepSeek-R1 in the CloudMatrix-Infer deployment (cmemu/trace/deepseek.py).",
        (
            _o("--phase", type=click.Choice(["decode", "prefill"]), default="decode", show_default=True,
               help="Step to generate."),
            _o("--ep", type=click.IntRange(min=2), default=None,
               help="EP degree [default: decode 320, or all dies if fewer; prefill 32]."),
            _o("--tokens-per-die", type=click.IntRange(min=1), default=96, show_default=True,
               help="Decode: tokens each die processes per step, speculative ones included."),
            _o("--kv-len", type=click.IntRange(min=1), default=4096, show_default=True),
            _o("--prompt-len", type=click.IntRange(min=1), default=4096, show_default=True,
               help="Prefill: tokens per prompt."),
            _o("--requests", type=click.IntRange(min=1), default=8, show_default=True,
               help="Prefill: requests per step (a multiple of micro-batches x EP / attn-tp)."),
            _o("--attn-tp", type=click.IntRange(min=2), default=8, show_default=True,
               help="Prefill: dies that split one request's attention heads (SP -> TP -> SP)."),
            _o("--reuse", type=click.FloatRange(0, 1), default=0.0, show_default=True,
               help="Prefill: EMS context-cache reuse rate (share of each prompt's KV fetched, not recomputed)."),
            _o("--ems-plane", type=click.Choice(["ub", "vpc", "hbm"]), default="ub", show_default=True,
               help="Prefill: where reused KV comes from: the EMS pool over UB or the VPC plane (fetch ops added, "
                    "reuse rounded down to whole blocks), or already in HBM."),
            _o("--pool-nodes", type=click.IntRange(min=1), default=None,
               help="Prefill: nodes whose CPUs form the EMS pool [default: all]."),
            _o("--ems-fetch", type=click.Choice(["whole", "layerwise"]), default="whole", show_default=True,
               help="Prefill: the EMS fetch waited for whole before layer 0, or read and waited for layer by layer."),
            _o("--kv-transfer", is_flag=True, default=False,
               help="Prefill: add each request's KV cache sent to its decode die over RDMA after its last layer."),
            _o("--decode-dp", type=click.IntRange(min=1), default=320, show_default=True,
               help="Prefill with --kv-transfer: decode DP ranks (one die each, after the prefill dies)."),
            _o("--micro-batches", type=click.Choice(["1", "2"]), default="2", show_default=True),
            _o("--mtp/--no-mtp", default=True, show_default=True),
            _o("--mtp-acceptance", type=click.FloatRange(0, 1), default=0.7, show_default=True),
            _o("--int8/--bf16", default=True, show_default=True, help="Weights and activations of the matmuls."),
            _o("--dispatch-engine", type=click.Choice(["aiv", "sdma"]), default=None,
               help="MoE dispatch/combine engine [default: aiv for decode, sdma for prefill]."),
            _o("--skew", type=click.FloatRange(min=0), default=0.0, show_default=True,
               help="Zipf exponent of expert popularity (0: uniform)."),
            _o("--layers", type=click.IntRange(1, 61), default=61, show_default=True),
            _o("--seed", type=click.IntRange(min=0), default=0, show_default=True),
            _o("--lm-head-tp", type=click.IntRange(min=1), default=1, show_default=True,
               help="Decode: dies that share the LM head's vocabulary (all-gather of the hidden states, then "
                    "an all-to-all of the logits); 1: each die holds the whole head."),
        ),
        _deepseek_r1,
        system_options_at=1,
    ),
    Generator(
        "model",
        "One decode or prefill step of any model: a shipped one by NAME (`cmemu models`) or the Hugging Face "
        "CONFIG.json of any other, in a deployment given by the options (cmemu/models/step.py).",
        (
            Argument("model_name", dict(metavar="NAME|CONFIG.json")),
            _o("--phase", type=click.Choice(["decode", "prefill"]), default="decode", show_default=True,
               help="Step to generate."),
            _o("--ep", type=click.IntRange(min=2), default=None,
               help="EP degree (dies; a dense model's data-parallel dies) [default: decode 320, or all dies if "
                    "fewer; prefill 32]."),
            _o("--experts-per-die", type=click.IntRange(min=1), default=None,
               help="Expert slots per die (routed experts, shared-expert copies, redundant copies) [default: enough "
                    "for every routed expert, and the shared one if it is placed in the EP group]."),
            _o("--shared-expert", type=click.Choice(["ep", "local"]), default="ep", show_default=True,
               help="ep: copies of the shared expert among the EP ranks, drawn as one more destination of the "
                    "routing (CloudMatrix-Infer); local: each die runs it on its own tokens."),
            _o("--tokens-per-die", type=click.IntRange(min=1), default=96, show_default=True,
               help="Decode: tokens each die processes per step, speculative ones included."),
            _o("--kv-len", type=click.IntRange(min=1), default=4096, show_default=True,
               help="Decode: cached positions per request."),
            _o("--prompt-len", type=click.IntRange(min=1), default=4096, show_default=True,
               help="Prefill: tokens per prompt."),
            _o("--requests", type=click.IntRange(min=1), default=8, show_default=True,
               help="Prefill: requests per step (a multiple of micro-batches x EP / attn-tp)."),
            _o("--attn-tp", type=click.IntRange(min=1), default=None,
               help="Dies that split the attention heads: prefill's SP -> TP -> SP (at least 2) [default 8]; "
                    "decode's tensor-parallel attention and dense FFN, all-reduced, the MoE on each die's own "
                    "tokens [default 1: data-parallel]."),
            _o("--reuse", type=click.FloatRange(0, 1), default=0.0, show_default=True,
               help="Prefill: EMS context-cache reuse rate (share of each prompt's KV fetched, not recomputed)."),
            _o("--micro-batches", type=click.Choice(["1", "2"]), default="2", show_default=True),
            _o("--attn-aic", type=click.IntRange(min=1), default=None,
               help="Decode: AIC of the attention stream (each with two AIV) [default: 16 of the die's 24 with "
                    "two micro-batches, the whole die with one]."),
            _o("--moe-aic", type=click.IntRange(min=1), default=None,
               help="Decode: AIC of the FFN/MoE stream (each with two AIV) [default: 8 of the die's 24 with two "
                    "micro-batches, the whole die with one]."),
            _o("--mtp/--no-mtp", default=None,
               help="Decode: multi-token prediction (two tokens per request per step) [default: on if the model "
                    "has an MTP module]."),
            _o("--mtp-acceptance", type=click.FloatRange(0, 1), default=0.7, show_default=True),
            _o("--weights", "weight_dtype", type=click.Choice(["int8", "bf16"]), default="int8", show_default=True,
               help="Weights and activations of the matmuls (attention stays bf16)."),
            _o("--dispatch-engine", type=click.Choice(["aiv", "sdma"]), default=None,
               help="MoE dispatch/combine engine [default: aiv for decode, sdma for prefill]."),
            _o("--skew", type=click.FloatRange(min=0), default=0.0, show_default=True,
               help="Zipf exponent of expert popularity (0: uniform)."),
            _o("--layers", type=click.IntRange(min=1), default=None, help="Layers [default: all the model's]."),
            _o("--seed", type=click.IntRange(min=0), default=0, show_default=True),
            _o("--lm-head-tp", type=click.IntRange(min=1), default=1, show_default=True,
               help="Decode: dies that share the LM head's vocabulary; 1: each die holds the whole head."),
        ),
        _model,
        system_options_at=2,
    ),
)}
