"""What a run checks of a trace against its system before simulating, beyond what the trace
alone can get wrong (cmemu.trace.check): per COMP and COMM_COLL node, its cores against the die's
and the die model's limits on its op (the tile fits the buffers, the schedule is small enough to
evaluate, its time fits the clock); per MoE collective, the memory its token routing takes.

``cmemu run`` (through the loader and the lowering) and ``cmemu trace validate`` call these same
functions, so that validate refuses what run would refuse, and says so for every node.
"""
from __future__ import annotations

from cmemu.errors import TraceError
from cmemu.workload.moe import moe_routing_bytes

# The engine's clock is an int64 count of picoseconds; one op may take at most 2**62 ps.
MAX_OP_PS = 2**62


def comp_problem(attrs: dict, die) -> tuple[str, str] | None:
    """(field, message) of the first reason the die cannot run this COMP as given, else None."""
    from cmemu.die.ops import AIV_PER_CLUSTER_AIC, node_cost, unit_cores
    from cmemu.vocab import CLUSTER_OPS

    unit, cores, total = unit_cores(die, attrs)
    if cores > total:
        return "cmemu.cores", f"{cores} cores requested, the die has {total} {unit.upper()} cores"
    if attrs.get("cmemu.op") in CLUSTER_OPS and AIV_PER_CLUSTER_AIC * cores > die.aiv_cores:
        return "cmemu.cores", (f"{cores} AIC need {AIV_PER_CLUSTER_AIC * cores} AIV beside them, the die has "
                               f"{die.aiv_cores}")
    if "cmemu.duration_ns" in attrs:
        return None  # a fixed time (checked against the clock with the trace)
    try:
        cost = node_cost(die, attrs)
    except ValueError as exc:
        # The cube's lack of a dtype mode is the dtype's fault; anything else the op's (or its work's).
        field = "cmemu.dtype" if "the cube has no" in str(exc) else ("cmemu.op" if "cmemu.op" in attrs else "num_ops")
        return field, str(exc)
    if cost.duration_ps > MAX_OP_PS:
        field = "cmemu.op" if "cmemu.op" in attrs else ("tensor_size" if cost.hbm_byte else "num_ops")
        return field, (f"the die model times it at {cost.duration_ps / 86400e12:,.0f} days, beyond what the engine's "
                       "clock holds (2**62 ps, about 53 days)")
    return None


def collective_problem(attrs: dict, die, members: int, limit_bytes: int | None) -> tuple[str, str] | None:
    """(field, message) of the first reason a COMM_COLL cannot run on this die, else None.
    ``members``: the size of its group; ``limit_bytes``: the memory a run may take."""
    cores = attrs.get("cmemu.cores", die.aiv_cores)
    if cores > die.aiv_cores:
        return "cmemu.cores", f"{cores} AIV requested, the die has {die.aiv_cores}"
    if "cmemu.tokens" in attrs and limit_bytes is not None:
        need = moe_routing_bytes(attrs["cmemu.tokens"], attrs["cmemu.top_k"], attrs.get("cmemu.experts", members),
                                 members)
        if need > limit_bytes:
            from cmemu.units import format_bytes

            field = "cmemu.experts" if attrs.get("cmemu.experts", members) > attrs["cmemu.tokens"] else "cmemu.tokens"
            return field, (f"routing {attrs['cmemu.tokens']:,} tokens to the top {attrs['cmemu.top_k']:,} of "
                           f"{attrs.get('cmemu.experts', members):,} experts on {members:,} members needs about "
                           f"{format_bytes(need)}, more than the memory limit of {format_bytes(limit_bytes)}")
    return None


def node_checker(spec, groups=None, limit_bytes: int | None = None):
    """The system's checks of a node, for ``cmemu.trace.check``'s ``node_check``: a function
    ``(type, attrs) -> [(field, message)]`` for COMP, COMM_COLL and MEM_LOAD nodes."""
    die = spec.die
    sizes = {name: len(ranks) for name, ranks in groups.items() if isinstance(ranks, list)} \
        if isinstance(groups, dict) else {}

    def check(ntype, attrs):
        if ntype == "MEM_LOAD":
            cpu = attrs.get("cmemu.src_cpu")
            if cpu is not None and cpu >= spec.cpus:
                return [("cmemu.src_cpu", f"CPU {cpu} is outside the system: {spec.name} has CPUs 0..{spec.cpus - 1}")]
            return []
        if ntype == "COMP":
            problem = comp_problem(attrs, die)
        else:
            problem = collective_problem(attrs, die, max(2, sizes.get(attrs.get("cmemu.group"), 2)), limit_bytes)
        return [problem] if problem else []

    return check


def raise_problem(problem, path: str, node_id) -> None:
    """A problem of comp_problem / collective_problem as the TraceError the lowering raises."""
    if problem is not None:
        field, message = problem
        raise TraceError(path, message, node_id, field)
