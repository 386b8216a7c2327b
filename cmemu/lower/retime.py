"""``cmemu run --retime``: COMP nodes that give both a measured time (``cmemu.duration_ns``) and
an operator with its shape (``cmemu.op``, as ``cmemu trace import`` writes them) are timed by
the die model instead, and a report says how the two compare (docs/trace-format.md, "Re-timing
measured ops").

The modelled time compared is each op's time on the die alone (cmemu.lower.compute.comp_cost,
on the cores it names): in the run, ops that share a die also share its cores and HBM.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

SHOWN = 3  # largest and smallest ratios named in the report


@dataclass
class RetimeReport:
    candidates: int  # COMP nodes with both a measured time and a shape
    retimed: int
    measured_ns: float  # of the re-timed nodes
    modelled_ns: float
    # (modelled / measured, node id, name), largest first; and smallest first
    largest: list
    smallest: list
    refused: dict  # reason -> count: candidates the die model cannot time (kept at their measured time)
    fixed: int  # COMP nodes left with their measured time (no shape)

    def line(self) -> str:
        if not self.candidates:
            return (f"retime: no COMP node gives both a measured time and a shape; {self.fixed:,} kept their fixed "
                    "time")
        text = f"retime: {self.retimed:,} of {self.candidates:,} measured ops with a shape re-timed by the die model"
        if self.retimed:
            ratio = self.modelled_ns / self.measured_ns if self.measured_ns else float("inf")
            text += (f": measured {self.measured_ns / 1000:,.3f} us, modelled {self.modelled_ns / 1000:,.3f} us "
                     f"(x{ratio:.3f}); modelled/measured largest " + _ratios(self.largest)
                     + "; smallest " + _ratios(self.smallest))
        for reason, count in sorted(self.refused.items()):
            text += f"; {count:,} kept their measured time: {reason}"
        if self.fixed:
            text += f"; {self.fixed:,} other COMP kept their fixed time (no shape)"
        return text


def _ratios(items) -> str:
    return ", ".join(f"x{r:.3f} (node {i} {name})" for r, i, name in items)


def retime_trace(trace, die, path: str):
    """(the trace with its measured ops re-timed, RetimeReport). Nodes that share an attrs dict
    keep sharing the new one."""
    from cmemu.lower.checks import comp_problem
    from cmemu.lower.compute import comp_cost
    from cmemu.trace.model import Trace

    new_attrs = {}  # id(old attrs) -> new attrs, or None when refused
    ratios = []
    refused = {}
    measured = modelled = 0.0
    candidates = fixed = 0
    nodes = []
    for node in trace.nodes:
        a = node.attrs
        if node.type != "COMP" or "cmemu.duration_ns" not in a:
            nodes.append(node)
            continue
        if "cmemu.op" not in a:
            fixed += 1
            nodes.append(node)
            continue
        candidates += 1
        key = id(a)
        if key not in new_attrs:
            b = {k: v for k, v in a.items() if k != "cmemu.duration_ns"}
            problem = comp_problem(b, die)
            new_attrs[key] = (None, problem[1]) if problem else (b, None)
        b, why = new_attrs[key]
        if b is None:
            reason = f"the die model refuses them ({why})"
            refused[reason] = refused.get(reason, 0) + 1
            nodes.append(node)
            continue
        model_ns = comp_cost(replace(node, attrs=b), die, path).duration_ps / 1000
        measured += a["cmemu.duration_ns"]
        modelled += model_ns
        ratio = model_ns / a["cmemu.duration_ns"] if a["cmemu.duration_ns"] else float("inf")
        ratios.append((ratio, node.id, node.name))
        nodes.append(replace(node, attrs=b))
    ratios.sort(key=lambda t: (-t[0], t[1]))
    report = RetimeReport(candidates, len(ratios), measured, modelled, ratios[:SHOWN],
                          sorted(ratios, key=lambda t: (t[0], t[1]))[:SHOWN], refused, fixed)
    if not ratios:
        return trace, report
    out = Trace(trace.path, trace.sha256, trace.header, nodes, trace.system)
    out.__dict__["graph"] = trace.graph  # the same nodes, places and edges
    return out, report
