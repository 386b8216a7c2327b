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
from cmemu.trace.ir import COMP_OPS

OPS = tuple(COMP_OPS)


def op_unit(op: str) -> str:
    """The unit whose cores ``cmemu.cores`` counts for an op."""
    return COMP_OPS[op][0]


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
        unit = a.get("cmemu.unit", "aic")
        total = die.aic_cores if unit == "aic" else die.aiv_cores
        return generic_cost(model, unit, a.get("num_ops", 0), a.get("tensor_size", 0), dtype,
                            a.get("cmemu.cores", total))
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
