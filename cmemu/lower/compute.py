"""COMP ops: timed by the die model (cmemu/die) when the trace is lowered.

A COMP with ``cmemu.duration_ns`` takes exactly that time. One with ``cmemu.op`` (a GEMM, MLA,
a vector op, with its shape) is lowered to its tile schedule on the pipes of the cores it names;
one with only ``num_ops`` (and ``tensor_size``) is a generic op streaming its bytes through MTE2
while the cube or vector unit does its work (docs/model.md, "Compute"). Each op is timed alone
here; at run time the ops running on a die share its cores (the pool) and its HBM bandwidth
(cmemu._core.hbm_sharing), but not its L2.
"""
from __future__ import annotations

from cmemu.spec.model import DieSpec
from cmemu.units import ns_to_ps


def comp_cost(node, die: DieSpec, path: str):
    """The die model's ``OpCost`` of a COMP node with work (``num_ops`` or ``cmemu.op``): its
    duration, per-pipe busy cycles, HBM and L2 bytes. None for a fixed-time node. A node the die
    cannot run (cmemu.lower.checks.comp_problem: too many cores, an op the die model refuses)
    raises its TraceError."""
    from cmemu.lower.checks import comp_problem, raise_problem

    raise_problem(comp_problem(node.attrs, die), path, node.id)
    if "cmemu.duration_ns" in node.attrs:
        return None
    from cmemu.die.ops import node_cost

    return node_cost(die, node.attrs)


def comp_duration_ps(node, die: DieSpec, path: str) -> int:
    """Duration of a COMP node in picoseconds."""
    attrs = node.attrs
    if "cmemu.duration_ns" in attrs:
        return ns_to_ps(attrs["cmemu.duration_ns"])
    return comp_cost(node, die, path).duration_ps
