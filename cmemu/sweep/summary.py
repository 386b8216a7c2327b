"""The summary of a sweep: one table of every point's parameters and figures, written as CSV and
HDF5 beside the points' folders, and printed briefly.

The table is in long form: one row per result row of each point (a scenario may print several
rows, in several tables), with the point's key, its status, the varied parameters, the result
table's title and that row's figures (units in their names, as the scenario wrote them). A point
that failed has one row with its error and no figures.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from cmemu.output.atomic import atomic_open, atomic_path

FIXED_COLUMNS = ("point", "status")
TAIL_COLUMNS = ("wall_time_s", "error")
PRINT_ROWS = 20
PRINT_FIGURES = 8
# What the printed summary of a trace run shows unless [summary] print says otherwise.
TRACE_HEADLINE = ("makespan_us", "exposed_comm.per_die_max_us", "ub_utilisation_percent",
                  "hbm.utilisation_per_die_mean_percent", "events")


def summary_parameters(sweep) -> list[str]:
    """The parameter columns: the system (varied or not), then the varied keys."""
    return list(dict.fromkeys(["system", *sweep.parameter_names]))


def summary_rows(sweep, outcomes: dict) -> tuple[list[dict], list[str]]:
    """``outcomes``: point key -> the dict ``run_point`` returned. Returns (rows, columns)."""
    params = summary_parameters(sweep)
    reserved = set(FIXED_COLUMNS) | set(params) | {"table"} | set(TAIL_COLUMNS)
    rows, figure_columns = [], {}
    for p in sweep.points:
        out = outcomes[p.key]
        head = {"point": p.key, "status": out["status"]}
        for name in params:
            head[name] = p.parameters.get(name, p.config.get("system") if name == "system" else None)
        tail = {"wall_time_s": round(float(out.get("wall_time_s", math.nan)), 3), "error": out.get("error", "")}
        if out["status"] != "ok":
            rows.append({**head, "table": None, **tail})
            continue
        if head["system"] is None:  # a trace run on its header's system
            head["system"] = out.get("parameters", {}).get("system")
        for title, table in out["tables"].items():
            if sweep.tables is not None and title not in sweep.tables:
                continue
            for r in table:
                figures = {}
                for k, v in r.items():
                    column = f"result.{k}" if k in reserved else k
                    figures[column] = v
                    figure_columns.setdefault(column, None)
                rows.append({**head, "table": title, **figures, **tail})
    columns = [*FIXED_COLUMNS, *params, "table", *figure_columns, *TAIL_COLUMNS]
    return rows, columns


def _cell(v):
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return "" if v is None else v


def write_csv(path: Path, rows: list[dict], columns: list[str], inputs=()) -> None:
    """Whole or not at all, never over ``inputs`` (cmemu.output.atomic)."""
    with atomic_open(path, "w", inputs=inputs, newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in columns])


def write_hdf5(path: Path, rows: list[dict], columns: list[str], attrs: dict, inputs=()) -> None:
    """Group ``/summary``: one 1-D dataset per column, in the order of its ``columns``
    attribute. Integer and boolean columns with a value in every row keep their type; other
    numeric columns are float64 with NaN where a row has none; the rest are UTF-8 strings."""
    import h5py
    import numpy as np

    with atomic_path(path, inputs) as tmp, h5py.File(tmp, "x") as f:  # "x": O_EXCL
        g = f.create_group("summary")
        g.attrs["columns"] = json.dumps(columns)
        for k, v in attrs.items():
            f.attrs[k] = v
        for c in columns:
            values = [r.get(c) for r in rows]
            present = [v for v in values if v is not None]
            if present and all(isinstance(v, bool) for v in present) and len(present) == len(values):
                data = np.array(values, dtype=bool)
            elif present and all(isinstance(v, int) and not isinstance(v, bool) for v in present) \
                    and len(present) == len(values):
                data = np.array(values, dtype=np.int64)
            elif present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
                data = np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)
            else:
                data = np.array([str(_cell(v)) for v in values], dtype=h5py.string_dtype())
            g.create_dataset(c, data=data)


def read_summary(path):
    """A sweep's summary.h5 as a pandas DataFrame (when pandas is installed), else a dict of
    numpy arrays, columns in the summary's order."""
    import h5py

    with h5py.File(path, "r") as f:
        g = f["summary"]
        columns = json.loads(g.attrs["columns"])
        data = {c: (g[c].asstr()[()] if g[c].dtype.kind == "O" else g[c][()]) for c in columns}
    try:
        import pandas as pd
    except ImportError:
        return data
    return pd.DataFrame(data, columns=columns)


def format_summary(rows: list[dict], columns: list[str], parameters: list[str], print_columns=None,
                   max_rows: int = PRINT_ROWS) -> str:
    """The summary as text: per result table, its rows (at most ``max_rows``) with the point,
    the varied ``parameters`` and its figures (``print_columns``, else the first
    ``PRINT_FIGURES`` it has; a trace run's default is ``TRACE_HEADLINE``); then the failed
    points, one line each."""
    from cmemu.output.table import format_table

    lines = []
    titles = list(dict.fromkeys(r["table"] for r in rows if r["status"] == "ok"))
    head = ["point", *parameters]
    for title in titles:
        table = [r for r in rows if r["status"] == "ok" and r["table"] == title]
        have = [c for c in columns if c not in (*FIXED_COLUMNS, *parameters, "table", *TAIL_COLUMNS)
                and any(r.get(c) is not None for r in table)]
        wanted = print_columns or (TRACE_HEADLINE if title == "run" and "makespan_us" in have else None)
        figures = [c for c in wanted if c in have] if wanted else have[:PRINT_FIGURES]
        keys = [*head, *figures, "wall_time_s"]
        shown = [{k: (r.get(k)[:8] if k == "point" else r.get(k)) for k in keys} for r in table[:max_rows]]
        lines.append(f"\n{title}")
        lines.append(format_table(shown))
        notes = []
        if len(table) > max_rows:
            notes.append(f"{len(table) - max_rows} more rows")
        if len(figures) < len(have):
            notes.append(f"{len(have) - len(figures)} more columns")
        if notes:
            lines.append(f"... {' and '.join(notes)} in summary.csv")
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines.append("\nfailed points")
        for r in failed:
            label = ", ".join(f"{k}={r[k]}" for k in parameters if r.get(k) is not None)
            lines.append(f"  {r['point'][:8]} ({label}): {r['error']}")
    return "\n".join(lines).lstrip("\n")
