"""mla: MLA decode attention (absorbed, DeepSeek-V3 shapes) on one die.

For each (tokens, KV length, heads) it prints the whole op (prologue projections, attention,
W_uv) and its attention phase alone: time, cube utilisation, achieved HBM bandwidth, and which
bound the attention is nearer to: its cube time (busy cycles per core) or its HBM time (bytes at
the HBM model's achieved bandwidth); and how FusedInferAttentionScore split the attention: the
AICs it used and the rows (request x M tile) it split over cores (FlashDecode) with their
largest number of splits. The defaults give one configuration of each kind: 128 heads per die
(as in DP attention, docs/machine.md 2.8) reuse each cached byte 128 times (compute-bound); 16 heads (as
after a tensor-parallel split over 8 dies) reuse it 16 times (memory-bound).
``--queries-per-request 2`` is MTP decode: each request's two query tokens share its KV reads.
"""
from __future__ import annotations

import click

from cmemu.errors import CmemuError
from cmemu.scenarios.common import scenario_command


def _ints(name, text):
    try:
        vals = [int(x) for x in str(text).split(",")]
    except ValueError:
        raise CmemuError(f"--{name} must be integers separated by commas, got {text!r}") from None
    if any(v <= 0 for v in vals):
        raise CmemuError(f"--{name} must be > 0, got {text!r}")
    return vals


def mla_rows(spec, tokens, kv_lens, heads, cores, dtype="bf16", queries_per_request=1) -> list[dict]:
    from cmemu.die.fia_mla import plan_decode_attention
    from cmemu.die.mla import MLAShape, mla_decode_cost
    from cmemu.die.model import DieModel

    model = DieModel.of(spec.die)
    rows = []
    for t in tokens:
        if t % queries_per_request:
            raise CmemuError(f"--tokens {t} is not a whole number of requests of {queries_per_request} queries "
                             "(--queries-per-request)")
        for s in kv_lens:
            for h in heads:
                try:
                    c = mla_decode_cost(model, t, s, MLAShape(heads=h), dtype, cores,
                                        queries_per_request=queries_per_request)
                except ValueError as exc:
                    raise CmemuError(str(exc)) from None
                plan = plan_decode_attention(t // queries_per_request, queries_per_request, h, s,
                                             cores or spec.die.aic_cores, dtype)
                att = next(p for p in c.phases if p.op == "mla_attention")
                cube_cycles = att.pipe_busy_cycles["AIC.CUBE"] / att.aic_cores
                hbm_cycles = att.hbm_byte / model.hbm_read_byte_per_cycle
                rows.append({
                    "tokens": t, "queries_per_request": queries_per_request, "kv_len": s, "heads": h, "dtype": dtype,
                    "duration_us": round(c.duration_us, 3),
                    "cube_utilisation_pct": round(100 * c.cube_utilisation, 1),
                    "hbm_gbyte_per_s": round(c.hbm_gbyte_per_s, 1),
                    "attention_us": round(att.duration_us, 3),
                    "attention_cube_utilisation_pct": round(100 * att.cube_utilisation, 1),
                    "attention_hbm_gbyte_per_s": round(att.hbm_gbyte_per_s, 1),
                    "attention_cube_us": round(model.cycles_to_ps(int(cube_cycles)) / 1e6, 3),
                    "attention_hbm_us": round(model.cycles_to_ps(int(hbm_cycles)) / 1e6, 3),
                    "attention_bound": "compute" if cube_cycles >= hbm_cycles else "memory",
                    "attention_aic_used": plan.cores_used,
                    "flash_decode_rows": len(plan.fd_heads),
                    "flash_decode_max_splits": plan.max_splits if plan.fd_heads else 0,
                })
    return rows


@scenario_command("mla")
@click.option("--tokens", default="96", show_default=True, help="Decode tokens (batch) per die; comma list.")
@click.option("--kv-len", default="4096", show_default=True, help="Cached positions per token; comma list.")
@click.option("--heads", default="128,16", show_default=True, help="Attention heads on the die; comma list.")
@click.option("--cores", type=int, default=None,
              help="AIC to use, each with its 2 AIV (default: all; decode stream 0 uses 16).")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "int8"]), default="bf16", show_default=True,
              help="KV cache and attention matmul type.")
@click.option("--queries-per-request", type=click.IntRange(min=1), default=1, show_default=True,
              help="Query tokens per request (MTP decode: 2); --tokens must be a multiple of it.")
def command(spec, tokens, kv_len, heads, cores, dtype, queries_per_request):
    """MLA decode attention on one die: compute utilisation and achieved HBM bandwidth."""
    if cores is not None and not (1 <= cores <= spec.die.aic_cores and 2 * cores <= spec.die.aiv_cores):
        raise CmemuError(f"--cores must be between 1 and {spec.die.aic_cores}, got {cores}")
    params = {"aic_cores": cores or spec.die.aic_cores, "aiv_cores": 2 * (cores or spec.die.aic_cores), "dtype": dtype,
              "queries_per_request": queries_per_request}
    return params, mla_rows(spec, _ints("tokens", tokens), _ints("kv-len", kv_len), _ints("heads", heads), cores, dtype,
                            queries_per_request)
