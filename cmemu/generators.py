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
    from cmemu.trace.deepseek import DecodeConfig, PrefillConfig, decode_trace
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
        what = f"{cfg.tokens_per_die} tokens/die"
    return doc, f"{phase}, {cfg.layers} layer(s), EP{cfg.ep}, {what}"


def _o(*decls, **settings) -> Option:
    return Option(decls, settings)


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
            _o("--kv-transfer", is_flag=True,
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
)}
