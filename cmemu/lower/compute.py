"""COMP ops: the roofline stand-in for the die model (issue 4 replaces it with tile pipelines).

An op runs on ``cmemu.cores`` cores of one unit (AIC cube or AIV vector; all of them by
default). Its time is the larger of its compute time at the unit's peak rate, scaled by the
share of cores it has, and the time to move ``tensor_size`` bytes at the die's HBM rate.
Not modelled: pipe overlap, tiling, caches, contention between streams sharing a die (two
concurrent ops on one die each get the cores they name).
"""
from __future__ import annotations

import math

from cmemu.errors import TraceError
from cmemu.spec.model import DieSpec
from cmemu.units import ns_to_ps

_DTYPE_BYTES = {"int8": 1, "fp16": 2, "bf16": 2, "fp32": 4}


def unit_peak_op_per_s(die: DieSpec, unit: str, dtype: str) -> float:
    """Peak operations per second of all of a die's cores of one unit, for one dtype."""
    clock_hz = die.ai_core_clock_mhz * 1e6
    if unit == "aic":
        if dtype in ("bf16", "fp16"):
            return die.aic_cores * die.cube_macs_per_cycle_bf16 * 2 * clock_hz
        if dtype == "int8":
            return die.aic_cores * die.cube_macs_per_cycle_int8 * 2 * clock_hz
        raise ValueError(f"the cube has no {dtype} mode in this model (use bf16, fp16 or int8)")
    # One lane per element of the 256 B vector; a fused multiply-add counts as two ops.
    lanes = die.vector_bytes_per_cycle // _DTYPE_BYTES[dtype]
    return die.aiv_cores * lanes * 2 * clock_hz


def comp_duration_ps(node, die: DieSpec, path: str) -> int:
    """Duration of a COMP node in picoseconds."""
    attrs = node.attrs
    if "cmemu.duration_ns" in attrs:
        return ns_to_ps(attrs["cmemu.duration_ns"])
    unit = attrs.get("cmemu.unit", "aic")
    dtype = attrs.get("cmemu.dtype", "bf16")
    total = die.aic_cores if unit == "aic" else die.aiv_cores
    cores = attrs.get("cmemu.cores", total)
    if cores > total:
        raise TraceError(path, f"{cores} cores requested, the die has {total} {unit.upper()} cores", node.id, "cmemu.cores")
    try:
        peak = unit_peak_op_per_s(die, unit, dtype) * cores / total
    except ValueError as exc:
        raise TraceError(path, str(exc), node.id, "cmemu.dtype") from None
    compute_s = attrs.get("num_ops", 0) / peak
    memory_s = attrs.get("tensor_size", 0) / (die.hbm_bandwidth_gbyte_per_s * 1e9)
    return int(math.ceil(max(compute_s, memory_s) * 1e12))
