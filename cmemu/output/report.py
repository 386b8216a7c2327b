"""``cmemu report``: a timeline's figures as a table, and PNG plots made with matplotlib (Agg).

Plots: ``gantt.png`` (ops of each stream, and pipe tasks when recorded, of a few dies over a time
window), ``links.png`` (a links x time heat map of utilisation when the timeline has binned link
counters, otherwise the busiest links' utilisation over the whole run), ``op_types.png`` (busy
time per op type and exposed communication, as a share of the makespan per die). HBM bandwidth
over time (``hbm.png``) when the timeline has ``/dies/hbm_binned``, against the die's capacity.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cmemu.errors import CmemuError
from cmemu.output.atomic import atomic_files, output_folder
from cmemu.output.reader import busiest_links, open_timeline
from cmemu.output.summary import HBM_CAPACITY_ACHIEVED
from cmemu.vocab import PIPE_NAMES

# One colour per op type (tab10), the same in every plot; grey for types added later.
OP_COLOURS = dict(zip(("COMP", "COMM_SEND", "COMM_RECV", "MEM_LOAD", "MEM_STORE", "COMM_COLL"),
                      ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#bcbd22")))
OTHER_COLOUR = "#7f7f7f"
PIPE_COLOURS = dict(zip(PIPE_NAMES, ("#d62728", "#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#aec7e8",
                                      "#ffbb78", "#98df8a")))
EXPOSED_COLOUR = "#d62728"
GANTT_DIES_DEFAULT = 4
# A time axis of at most this many columns: a timeline's bins are merged, a few at a time, beyond
# it (a plot is about a thousand pixels wide; a grid of every 1 ns bin could take gigabytes).
MAX_PLOT_BINS = 4096


def _plot_bins(nbins: int) -> tuple[int, int]:
    """(columns, bins per column) for a time axis of ``nbins`` bins."""
    per = max(1, -(-nbins // MAX_PLOT_BINS))
    return -(-nbins // per), per


def parse_dies(text: str | None, dies: int) -> list[int]:
    """'0,1,16' or '0-3' or '0-3,16' -> die indices, each checked against the system (a range
    before it is expanded: '0-1000000000' is refused, not built)."""
    if text is None:
        return list(range(min(GANTT_DIES_DEFAULT, dies)))
    out = []
    bad = False
    for part in str(text).split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if not 0 <= lo <= hi < dies:
                    bad = True
                    break
                out.extend(range(lo, hi + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise CmemuError(f"--dies {_shown(text)}: write die numbers such as 0,1,16 or ranges such as 0-3") from None
    bad = bad or any(not 0 <= d < dies for d in out)
    if bad or not out:
        raise CmemuError(f"--dies {_shown(text)}: dies are numbered 0 to {dies - 1} (a range LO-HI needs "
                         "LO <= HI)")
    return list(dict.fromkeys(out))


def _shown(text, limit: int = 60) -> str:
    """An option's value for a one-line message, cut short if long."""
    text = str(text)
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


def _fmt_us(ps) -> str:
    return f"{ps / 1e6:,.3f}"


def report_text(t, summary: dict) -> str:
    from cmemu.output.table import format_table

    s = summary
    fabric = str(t.attrs.get("fabric_model", "packet"))  # v5; before, always the packet model
    lines = [f"cmemu report {t.path} (timeline v{t.version}, preset {s['preset']}, {s['dies']} dies, "
             f"{fabric}-level fabric)"]
    lines.append(f"  makespan             {s['makespan_us']:,.3f} us")
    lines.append(f"  ops                  {s['ops']:,}; messages {s['messages']:,} ({s['message_bytes']:,} B)")
    e = s["exposed_comm"]
    lines.append(f"  exposed comm         per die: mean {e['per_active_die_mean_us']:,.3f} us, max "
                 f"{e['per_die_max_us']:,.3f} us on die {e['die_max']} ({t.die_name(e['die_max'])}), "
                 f"{e['share_of_makespan_max_percent']:.1f}% of the makespan")
    lines.append("                       (a COMM_RECV or COMM_COLL in progress while no COMP or MEM op runs on its die)")
    lines.append(f"  UB links             {s['ub_utilisation_percent']:.2f}% of the capacity of all UB links "
                 "over the makespan")
    lines.extend(_hbm_lines(t, s["hbm"]))
    lines.append(f"  pipe tasks           {s['tasks']}")
    if not t.has_tasks():
        lines.append("                       (so no cube/vector utilisation: it needs the pipe model)")
    for name, p in s["pipes"].items():
        lines.append(f"    {name:<10} {p['tasks']:,} tasks on {p['dies']} dies, {p['total_time_us']:,.3f} us of task "
                     f"time; active {p['busy_per_die_mean_percent']:.1f}% of the makespan per die (mean)")
    lines.append(f"  link time series     {s['link_bins']}")
    lines.append("")
    lines.append("time per op type (busy = time at least one op of the type runs on a die)")
    rows = []
    for name, o in s["op_types"].items():
        rows.append({"op type": name, "count": o["count"], "sum of op times (us)": o["total_time_us"],
                     "busy per die, mean (us)": o["busy_time_per_active_die_mean_us"],
                     "busy per die, max (us)": o["busy_time_per_die_max_us"],
                     "busy per die, mean (% of makespan)": 100.0 * o["busy_time_per_active_die_mean_us"]
                     / s["makespan_us"] if s["makespan_us"] else 0.0})
    lines.append(format_table(rows))
    lines.append("")
    lines.append("links by kind (utilisation = busy time / makespan)")
    rows = [{"kind": k, "links": v["links"], "used": v["links_used"], "bytes (B)": v["bytes"],
             "mean util, used links (%)": v["utilisation_mean_of_used_percent"],
             "max util (%)": v["utilisation_max_percent"]} for k, v in s["link_kinds"].items()]
    lines.append(format_table(rows))
    lines.append("")
    lines.append("ten busiest links")
    top = busiest_links(t, 10)
    rows = [{"link": b["link"], "kind": b["kind"], "from": b["src"], "to": b["dst"], "bytes (B)": b["bytes"],
             "util (%)": b["utilisation_percent"]} for b in top]
    lines.append(format_table(rows) if rows else "(no link carried traffic)")
    return "\n".join(lines)


def _hbm_lines(t, h: dict) -> list[str]:
    pad = " " * 23
    where = f" on die {h['die_max']}" if h["die_max"] >= 0 else ""
    lines = [f"  HBM                  per die: mean {h['utilisation_per_die_mean_percent']:.2f}%, max "
             f"{h['utilisation_per_die_max_percent']:.2f}%{where} of {h['capacity_gbyte_per_s']:,.0f} GB/s "
             f"over the makespan ({h['bytes']:,} B)"]
    if h["capacity"] == HBM_CAPACITY_ACHIEVED:
        lines.append(f"{pad}(capacity: the die model's achieved sequential read rate, which the engine shares "
                     f"among a die's running ops; nominal {h['nominal_gbyte_per_s']:,.0f} GB/s)")
    else:
        lines.append(f"{pad}(capacity: {h['capacity']})")
    lines.append(f"{pad}(bytes: {h['source']})")
    b = h.get("busiest_stack")
    if b:
        lines.append(f"{pad}busiest stack: die {b['die']} stack {b['stack']} of {b['stacks_per_die']}, "
                     f"{b['utilisation_percent']:.2f}% of its {h['capacity_gbyte_per_s'] / b['stacks_per_die']:,.0f} "
                     f"GB/s share ({b['share_of_die_bytes_percent']:.1f}% of the die's bytes)")
    p = h.get("busiest_bin")
    if p:
        lines.append(f"{pad}busiest {p['bin_us']:,.3f} us bin: die {p['die']} at {p['start_us']:,.3f} us, "
                     f"{p['gbyte_per_s']:,.0f} GB/s ({p['utilisation_percent']:.1f}% of the capacity)")
        if p["utilisation_percent"] > 100.05:
            lines.append(f"{pad}  (above the capacity: a file written before the bins followed the HBM sharing "
                         "(each op's bytes evenly over its run); the figures over the makespan are not affected)")
    if h.get("note"):
        lines.append(f"{pad}note: {h['note']}")
    return lines


def run_report(path, plots_dir=None, window=None, dies=None, as_json=False, echo=print) -> list[Path]:
    """Print the summary of a timeline; write the plots when ``plots_dir`` is given. Returns the PNGs."""
    from cmemu.output.perfetto import parse_window

    with open_timeline(path) as t:
        win = parse_window(window) or (0, max(t.sim_end_ps, 1))
        die_list = parse_dies(dies, t.dies_count)
        if plots_dir is not None:  # before the work: a folder that takes no file
            plots_dir = output_folder(plots_dir)
        s = t.summary()
        if as_json:
            s["busiest_links"] = busiest_links(t, 10)
            echo(json.dumps(s, indent=2))
        else:
            echo(report_text(t, s))
        written = []
        if plots_dir is not None:
            written = write_plots(t, s, plots_dir, win, die_list)
            if not as_json:
                echo("")
                for p in written:
                    echo(f"plot  {p}")
                if not t.has_hbm_bins():
                    echo("plot  (HBM bandwidth over time: not plotted, the timeline records no HBM time series)")
        return written


def write_plots(t, s: dict, out: Path, win: tuple[int, int], dies: list[int], inputs=()) -> list[Path]:
    """Write the PNGs into the folder ``out``: all of them, or (after an error or an interrupt)
    none (``cmemu.output.atomic.atomic_files``); never over the timeline or another of ``inputs``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = [("gantt.png", _gantt), ("links.png", _links), ("op_types.png", _op_types)]
    if t.has_hbm_bins():
        plots.append(("hbm.png", _hbm))
    paths = [Path(out) / name for name, _fn in plots]
    with atomic_files(paths, "wb", inputs=(*inputs, t.path)) as files:
        for (_name, fn), f in zip(plots, files):
            fig = fn(plt, t, s, win, dies)
            try:
                fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
            finally:
                plt.close(fig)
    return paths


def _gantt(plt, t, s, win, dies):
    """One horizontal lane per (die, stream) and per (die, pipe), bars coloured by op type / pipe."""
    from matplotlib.patches import Patch

    ops = t.columns("ops")
    lo, hi = win
    lanes = []  # (label, [(start_us, width_us)], colours)
    used_types, used_pipes = set(), set()
    tasks = t.columns("tasks") if t.has_tasks() else None
    for d in dies:
        on_die = np.flatnonzero((ops["rank"] == d) & (ops["end_ps"] >= lo) & (ops["start_ps"] <= hi))
        for stream in np.unique(ops["stream"][on_die]).tolist():
            rows = on_die[ops["stream"][on_die] == stream]
            st = np.clip(ops["start_ps"][rows], lo, hi)
            en = np.clip(ops["end_ps"][rows], lo, hi)
            types = [t.op_types[c] for c in ops["type"][rows]]
            used_types.update(types)
            lanes.append((f"die {d} stream {stream}", st, en, [OP_COLOURS.get(x, OTHER_COLOUR) for x in types],
                          ops["name"][rows]))
        if tasks is not None:
            sel = np.flatnonzero((tasks["die"] == d) & (tasks["end_ps"] >= lo) & (tasks["start_ps"] <= hi))
            for pipe in np.unique(tasks["pipe"][sel]).tolist():
                rows = sel[tasks["pipe"][sel] == pipe]
                name = t.pipes[pipe]
                used_pipes.add(name)
                lanes.append((f"die {d} {name}", np.clip(tasks["start_ps"][rows], lo, hi),
                              np.clip(tasks["end_ps"][rows], lo, hi), [PIPE_COLOURS.get(name, OTHER_COLOUR)] * rows.size, None))
    height = max(2.5, 0.45 * len(lanes) + 1.6)
    fig, ax = plt.subplots(figsize=(12, height))
    for y, (label, st, en, colours, op_names) in enumerate(lanes):
        ax.broken_barh(list(zip(st / 1e6, np.maximum(en - st, 0) / 1e6)), (y - 0.38, 0.76),
                       facecolors=colours, edgecolor="white", linewidth=0.3)
        if op_names is None:
            continue
        # Name the ops wide enough to hold a label (about 7% of the window).
        for i in np.flatnonzero(en - st > 0.07 * (hi - lo)):
            ax.text((st[i] + en[i]) / 2e6, y, str(op_names[i]), ha="center", va="center", fontsize=7,
                    color="white", clip_on=True)
    for y in range(1, len(lanes)):  # a rule between dies
        if lanes[y][0].split()[1] != lanes[y - 1][0].split()[1]:
            ax.axhline(y - 0.5, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(lanes)), [lane[0] for lane in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(lo / 1e6, hi / 1e6)
    ax.set_xlabel("simulated time (µs)")
    ax.set_title(f"Ops per stream{' and pipe tasks' if tasks is not None else ''}, dies {', '.join(map(str, dies))}, "
                 f"{lo / 1e6:,.3f} to {hi / 1e6:,.3f} µs ({t.attrs.get('preset')})")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=OP_COLOURS.get(x, OTHER_COLOUR), label=x) for x in t.op_types if x in used_types]
    handles += [Patch(color=PIPE_COLOURS.get(x, OTHER_COLOUR), label=x) for x in t.pipes if x in used_pipes]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="op type / pipe")
    if not lanes:
        ax.text(0.5, 0.5, "no ops of these dies in this window", transform=ax.transAxes, ha="center")
    return fig


def _links(plt, t, s, win, dies):
    c = t.columns("links")
    names = t.vertex_names()
    end = t.sim_end_ps
    if t.has_link_bins():
        return _link_heatmap(plt, t, c)
    busy = c["busy_ps"]
    order = np.lexsort((np.arange(busy.size), -busy))
    top = [i for i in order[:30] if busy[i] > 0]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, max(4.0, 0.28 * len(top) + 1.5)),
                                  gridspec_kw={"width_ratios": [3, 2]})
    util = 100.0 * busy / end if end > 0 else np.zeros(busy.shape)
    labels = [f"{i}: {t.link_kinds[c['kind'][i]]}  {names[c['src_vertex'][i]]} → {names[c['dst_vertex'][i]]}"
              for i in top]
    ax.barh(range(len(top)), util[top], color="#1f77b4")
    ax.set_yticks(range(len(top)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("utilisation over the run (% of makespan busy)")
    ax.set_title(f"The {len(top)} busiest links")
    ax.grid(axis="x", alpha=0.3)
    kinds = [k for k in range(len(t.link_kinds)) if np.any((c["kind"] == k) & (busy > 0))]
    mean = [util[(c["kind"] == k) & (busy > 0)].mean() for k in kinds]
    mx = [util[c["kind"] == k].max() for k in kinds]
    y = np.arange(len(kinds))
    ax2.barh(y - 0.2, mean, 0.4, label="mean of links used", color="#2ca02c")
    ax2.barh(y + 0.2, mx, 0.4, label="max", color="#ff7f0e")
    ax2.set_yticks(y, [t.link_kinds[k] for k in kinds])
    ax2.invert_yaxis()
    ax2.set_xlabel("utilisation over the run (%)")
    ax2.set_title("By link kind")
    ax2.legend(loc="lower right")
    ax2.grid(axis="x", alpha=0.3)
    fig.suptitle("Link utilisation (the timeline has no binned link counters, so no time axis)", y=1.0)
    fig.tight_layout()
    return fig


def _link_heatmap(plt, t, c):
    from matplotlib.colors import Normalize

    b = t.columns("links/binned")
    bin_ps = t.link_bin_ps
    nbins = max(int(b["bin"].max()) + 1 if b["bin"].size else 1, -(-t.sim_end_ps // bin_ps))
    nbins, per = _plot_bins(nbins)
    bin_ps *= per
    used = np.unique(b["link"])
    # Rows grouped by kind, then by link number.
    used = used[np.lexsort((used, c["kind"][used]))]
    row = np.full(c["kind"].size, -1)
    row[used] = np.arange(used.size)
    grid = np.zeros((used.size, nbins))
    np.add.at(grid, (row[b["link"]], b["bin"] // per), 100.0 * b["busy_ps"] / bin_ps)
    fig, ax = plt.subplots(figsize=(12, min(12.0, max(3.5, 0.02 * used.size + 2.5))))
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis", norm=Normalize(0, 100),
                   extent=(0, nbins * bin_ps / 1e6, used.size - 0.5, -0.5))
    kinds = c["kind"][used]
    ticks, labels = [], []
    for k in np.unique(kinds):
        rows = np.flatnonzero(kinds == k)
        ticks.append(rows.mean())
        labels.append(f"{t.link_kinds[k]} ({rows.size})")
        if rows[0] > 0:
            ax.axhline(rows[0] - 0.5, color="white", linewidth=0.8)
    ax.set_yticks(ticks, labels)
    ax.set_xlabel(f"simulated time (µs), bins of {bin_ps / 1e6:,.3f} µs")
    ax.set_ylabel("links that carried traffic, by kind")
    ax.set_title("Link utilisation per time bin")
    fig.colorbar(im, ax=ax, label="utilisation (% of the bin busy)")
    return fig


def _hbm(plt, t, s, win, dies):
    """HBM bandwidth over time: the chosen dies, and the mean and the busiest over all dies."""
    c = t.columns("dies/hbm_binned")
    bin_ps = t.hbm_bin_ps
    nbins = max(int(c["bin"].max()) + 1 if c["bin"].size else 1, -(-t.sim_end_ps // bin_ps))
    nbins, per = _plot_bins(nbins)
    bin_ps *= per
    grid = np.zeros((t.dies_count, nbins))
    np.add.at(grid, (c["die"], c["bin"] // per), c["bytes"] / (bin_ps / 1e12) / 1e9)  # GB/s
    x = (np.arange(nbins) + 0.5) * bin_ps / 1e6
    lo, hi = win[0] / 1e6, win[1] / 1e6
    fig, ax = plt.subplots(figsize=(12, 4.5))
    ax.fill_between(x, grid.min(axis=0), grid.max(axis=0), color="0.85", label="range over all dies", step="mid")
    ax.plot(x, grid.mean(axis=0), color="black", linewidth=1.2, label="mean over all dies", drawstyle="steps-mid")
    for d in dies[:6]:
        ax.plot(x, grid[d], linewidth=0.9, label=t.die_name(d), drawstyle="steps-mid")
    h = s["hbm"]
    cap = float(h["capacity_gbyte_per_s"])
    nominal = float(h["nominal_gbyte_per_s"])
    achieved = h["capacity"] == HBM_CAPACITY_ACHIEVED
    ax.axhline(cap, color="tab:red", linestyle="--", linewidth=0.8,
               label=f"capacity {cap:,.0f} GB/s" + (" (achieved read rate)" if achieved else " (nominal)"))
    if achieved:
        ax.axhline(nominal, color="0.4", linestyle=":", linewidth=0.8, label=f"nominal {nominal:,.0f} GB/s")
    ax.set_xlim(lo, hi)
    top = float(grid.max()) if grid.size else 0.0
    ax.set_ylim(0, max(cap, nominal, top) * 1.1)
    if top > cap * 1.001:
        ax.text(0.01, 0.97, "above the capacity: a file written before the bins followed the HBM sharing "
                "(each op's bytes evenly over its run)",
                transform=ax.transAxes, fontsize=8, va="top", color="tab:red")
    ax.set_xlabel(f"simulated time (µs), bins of {bin_ps / 1e6:,.3f} µs")
    ax.set_ylabel("HBM bandwidth (GB/s)")
    ax.set_title("HBM bandwidth per die (each op's HBM traffic over its run, as its share allowed)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


def _op_types(plt, t, s, win, dies):
    d = t.dies_columns()
    end = max(t.sim_end_ps, 1)
    active = d["any_busy_ps"] > 0
    names, mean, lo, hi, colours = [], [], [], [], []
    for i, name in enumerate(t.op_types):
        if name not in s["op_types"]:
            continue
        v = 100.0 * d["busy_ps"][active, i] / end
        names.append(name)
        mean.append(v.mean())
        lo.append(v.mean() - v.min())
        hi.append(v.max() - v.mean())
        colours.append(OP_COLOURS.get(name, OTHER_COLOUR))
    v = 100.0 * d["exposed_comm_ps"][active] / end
    names.append("exposed comm")
    mean.append(v.mean() if v.size else 0.0)
    lo.append(mean[-1] - (v.min() if v.size else 0.0))
    hi.append((v.max() if v.size else 0.0) - mean[-1])
    colours.append(EXPOSED_COLOUR)
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(names) + 1.8))
    y = np.arange(len(names))
    ax.barh(y, mean, xerr=[lo, hi], color=colours, capsize=4, ecolor="black")
    for yi, m, h in zip(y, mean, hi):
        ax.text(m + h + 1, yi, f"{m:.1f}%", fontsize=8, va="center")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlim(0, 105)
    ax.set_xlabel("busy time per die (% of the makespan); bar = mean over dies with ops, whiskers = min to max")
    ax.set_title(f"Op-type breakdown, {int(active.sum())} dies, makespan {end / 1e6:,.3f} µs")
    ax.grid(axis="x", alpha=0.3)
    return fig
