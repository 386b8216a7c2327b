"""COMP ops: timed by the die model (cmemu/die) when the trace is lowered.

A COMP with ``cmemu.duration_ns`` takes exactly that time. One with ``cmemu.op`` (a GEMM, MLA,
a vector op, with its shape) is lowered to its tile schedule on the pipes of the cores it names;
one with only ``num_ops`` (and ``tensor_size``) is a generic op streaming its bytes through MTE2
while the cube or vector unit does its work (docs/model.md, "Compute"). Each op is timed alone
here; at run time the ops running on a die share its cores (the pool) and its HBM bandwidth
(cmemu._core.hbm_sharing), but not its L2.
"""
from __future__ import annotations

from cmemu.errors import TraceError
from cmemu.spec.model import DieSpec
from cmemu.trace.ir import CLUSTER_OPS
from cmemu.units import ns_to_ps


def _check_cores(node, die: DieSpec, path: str) -> None:
    from cmemu.die.ops import op_unit

    attrs = node.attrs
    op = attrs.get("cmemu.op")
    unit = op_unit(op) if op else attrs.get("cmemu.unit", "aic")
    total = die.aic_cores if unit == "aic" else die.aiv_cores
    cores = attrs.get("cmemu.cores", total)
    if cores > total:
        raise TraceError(path, f"{cores} cores requested, the die has {total} {unit.upper()} cores", node.id,
                         "cmemu.cores")
    if op in CLUSTER_OPS and 2 * cores > die.aiv_cores:
        raise TraceError(path, f"{cores} AIC need {2 * cores} AIV beside them, the die has {die.aiv_cores}",
                         node.id, "cmemu.cores")


def comp_cost(node, die: DieSpec, path: str):
    """The die model's ``OpCost`` of a COMP node with work (``num_ops`` or ``cmemu.op``): its
    duration, per-pipe busy cycles, HBM and L2 bytes. None for a fixed-time node."""
    if "cmemu.duration_ns" in node.attrs:
        return None
    from cmemu.die.ops import node_cost

    _check_cores(node, die, path)
    try:
        return node_cost(die, node.attrs)
    except ValueError as exc:
        # The cube's lack of a dtype mode is the dtype's fault; anything else the op's (or its work's).
        field = "cmemu.dtype" if "the cube has no" in str(exc) else (
            "cmemu.op" if "cmemu.op" in node.attrs else "num_ops")
        raise TraceError(path, str(exc), node.id, field) from None


def comp_duration_ps(node, die: DieSpec, path: str) -> int:
    """Duration of a COMP node in picoseconds."""
    attrs = node.attrs
    if "cmemu.duration_ns" in attrs:
        return ns_to_ps(attrs["cmemu.duration_ns"])
    return comp_cost(node, die, path).duration_ps
