"""MoE dispatch/combine pairs: each MOE_COMBINE of a trace with the MOE_DISPATCH whose tokens it
brings back (written as /moe/pairs; read by ``Timeline.moe_pairs``).
"""
from __future__ import annotations

import numpy as np


MOE_PAIR_WALK_LIMIT = 4096  # ops a combine's dependencies are searched through for its dispatch


def moe_pairs(trace) -> dict:
    """Each MOE_COMBINE of the trace with the MOE_DISPATCH whose tokens it brings back: the
    dispatch of the same rank and group (``cmemu.group``) nearest to it through its data and
    control dependencies (breadth first, at most MOE_PAIR_WALK_LIMIT ops; stream order is not
    followed, as a stream may hold the next micro-batch's dispatch before this one's combine).
    A combine with no such dispatch is left out. Rows of the trace's ops, one per pair."""
    from collections import deque

    nodes = trace.nodes
    index = {node.id: i for i, node in enumerate(nodes)}

    def kind(node):
        return node.attrs.get("comm_type") if node.type == "COMM_COLL" else None

    disp, comb = [], []
    for c, node in enumerate(nodes):
        if kind(node) != "MOE_COMBINE":
            continue
        group = node.attrs.get("cmemu.group")
        seen = {c}
        todo = deque([c])
        found = -1
        while todo and found < 0 and len(seen) <= MOE_PAIR_WALK_LIMIT:
            n = nodes[todo.popleft()]
            for d in list(n.data_deps) + list(n.ctrl_deps):
                j = index[d]
                if j in seen:
                    continue
                seen.add(j)
                m = nodes[j]
                if kind(m) == "MOE_DISPATCH" and m.rank == node.rank and m.attrs.get("cmemu.group") == group:
                    found = j
                    break
                todo.append(j)
        if found >= 0:
            disp.append(found)
            comb.append(c)
    return {"dispatch_op": np.asarray(disp, dtype=np.int32), "combine_op": np.asarray(comb, dtype=np.int32)}
