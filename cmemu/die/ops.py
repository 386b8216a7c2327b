"""From a trace COMP node's attributes to the die model's cost (docs/trace-format.md, COMP).

``cmemu.op`` names an operator with a shape; without it a COMP with ``num_ops`` is a generic op
on the pipes (kernels.generic_cost). Costs are memoised: a trace repeats the same op many times.
"""
from __future__ import annotations

from functools import lru_cache

from cmemu.die.gemm import gemm_cost
from cmemu.die.kernels import VECTOR_OPS, generic_cost, vector_cost
from cmemu.die.mla import MLAShape, mla_attention_cost, mla_decode_cost, mla_prefill_attention_cost, mla_prefill_cost
from cmemu.die.model import DieModel, OpCost
from cmemu.vocab import CLUSTER_OPS, COMP_OPS

OPS = tuple(COMP_OPS)
AIV_PER_CLUSTER_AIC = 2  # an op of CLUSTER_OPS holds each AIC with its two AIVs (a 1 AIC + 2 AIV cluster)


def op_unit(op: str) -> str:
    """The unit whose cores ``cmemu.cores`` counts for an op."""
    return COMP_OPS[op][0]


def unit_cores(die, attrs: dict) -> tuple[str, int, int]:
    """(unit, cores, total) of a COMP: the unit whose cores ``cmemu.cores`` counts (its operator's;
    for a generic op ``cmemu.unit``, AIC by default), the cores it asks for (``cmemu.cores``, all
    of the unit's by default) and how many of them the die has."""
    op = attrs.get("cmemu.op")
    unit = op_unit(op) if op else attrs.get("cmemu.unit", "aic")
    total = die.aic_cores if unit == "aic" else die.aiv_cores
    return unit, attrs.get("cmemu.cores", total), total


def held_cores(die, attrs: dict) -> tuple[int, int]:
    """(AIC, AIV) cores a COMP holds while it runs. A COMP given only a duration holds none
    unless it names ``cmemu.cores``; MLA ops hold two AIV per AIC (their softmax side)."""
    if "cmemu.duration_ns" in attrs and "cmemu.cores" not in attrs:
        return 0, 0
    unit, cores, _total = unit_cores(die, attrs)
    if attrs.get("cmemu.op") in CLUSTER_OPS:
        return cores, AIV_PER_CLUSTER_AIC * cores
    return (cores, 0) if unit == "aic" else (0, cores)


def node_cost(die, attrs: dict) -> OpCost:
    """Cost of a COMP node with ``num_ops`` or ``cmemu.op`` (not ``cmemu.duration_ns``)."""
    key = tuple(sorted((k, v) for k, v in attrs.items() if k.startswith("cmemu.") or k in ("num_ops", "tensor_size")))
    return _cost(die, key)


@lru_cache(maxsize=4096)
def _cost(die, key) -> OpCost:
    a = dict(key)
    model = DieModel.of(die)
    dtype = a.get("cmemu.dtype", "bf16")
    op = a.get("cmemu.op")
    if op is None:
        unit, cores, _total = unit_cores(die, a)
        return generic_cost(model, unit, a.get("num_ops", 0), a.get("tensor_size", 0), dtype, cores)
    cores = a.get("cmemu.cores")
    if op in ("gemm", "grouped_gemm"):
        return gemm_cost(model, a["cmemu.m"], a["cmemu.n"], a["cmemu.k"], a.get("cmemu.groups", 1), dtype, cores,
                         a.get("cmemu.tile_m", 128), a.get("cmemu.tile_n", 152), op=op)
    if op in ("mla_decode", "mla_attention"):
        shape = MLAShape(heads=a.get("cmemu.heads", MLAShape.heads))
        fn = mla_decode_cost if op == "mla_decode" else mla_attention_cost
        return fn(model, a["cmemu.tokens"], a["cmemu.kv_len"], shape, dtype, cores,
                  queries_per_request=a.get("cmemu.queries_per_request", 1))
    if op == "mla_prefill":
        shape = MLAShape(heads=a.get("cmemu.heads", MLAShape.heads))
        return mla_prefill_cost(model, a["cmemu.tokens"], shape, dtype, cores)
    if op == "mla_prefill_attention":
        shape = MLAShape(heads=a.get("cmemu.heads", MLAShape.heads))
        return mla_prefill_attention_cost(model, a["cmemu.tokens"], a["cmemu.kv_len"], shape, dtype, cores)
    if op in ("gqa_attention", "gqa_prefill_attention"):
        from cmemu.die.gqa import gqa_attention_cost, gqa_prefill_attention_cost

        heads = (a["cmemu.heads"], a["cmemu.kv_heads"], a["cmemu.head_dim"])
        if op == "gqa_attention":
            return gqa_attention_cost(model, a["cmemu.tokens"], a["cmemu.kv_len"], *heads, dtype, cores,
                                      queries_per_request=a.get("cmemu.queries_per_request", 1))
        return gqa_prefill_attention_cost(model, a["cmemu.tokens"], a["cmemu.kv_len"], *heads, dtype, cores)
    if op in VECTOR_OPS:
        return vector_cost(model, op, a["cmemu.rows"], a["cmemu.cols"], cores, dtype=dtype)
    raise ValueError(f"unknown cmemu.op {op!r} (known: {', '.join(OPS)})")
