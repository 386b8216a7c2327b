"""Rows of figures (dicts whose keys carry their unit) as a text table, as scenarios, reports and
sweep summaries print them."""
from __future__ import annotations


def format_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)"
    keys = list(rows[0])
    for r in rows[1:]:
        keys += [k for k in r if k not in keys]

    def cell(v):
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 1000 else f"{v:,.1f}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return "" if v is None else str(v)

    cells = [[cell(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
