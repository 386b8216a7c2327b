"""The ``cmemu`` command line. Every CmemuError becomes one line on stderr and exit status 2."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from cmemu.clihelpers import EXIT_INPUT_ERROR, CommandLine, interrupted_exit, one_line, reports_errors
from cmemu.errors import CmemuError
from cmemu.generators import GENERATORS
from cmemu.options import DEFAULT_SYSTEM, RUN_OPTIONS


def _system_options(fn):
    fn = click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="PATH=VALUE",
        help="Override a spec field, e.g. --set ub.link_rate_gbit_per_s=200 (repeatable).",
    )(fn)
    fn = click.option("--system", "-s", default=None, metavar="NAME", help="System preset (see `cmemu presets`).")(fn)
    return fn


@click.group(cls=CommandLine, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cmemu")
def main():
    """cmemu: a cycle-approximate emulator of the Huawei CloudMatrix384 supernode."""
    import warnings

    from cmemu.kernels import COMPILE_NOTICE, tell_compiles

    tell_compiles(lambda: click.echo(COMPILE_NOTICE, err=True))
    warnings.showwarning = _show_warning


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """cmemu's own warnings (what a run leaves out, and why) as one line for the user, not as a
    Python warning with its source line; other packages' warnings as Python prints them."""
    import warnings

    if category is UserWarning and "cmemu" in str(filename):
        click.echo(f"cmemu: warning: {message}", err=True)
    else:
        click.echo(warnings.formatwarning(message, category, filename, lineno, line).rstrip(), err=True)


@main.command()
@click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="HDF5 timeline to write [default: TRACE's name with .h5, in the current folder].")
@_system_options
@RUN_OPTIONS["engine"].option()
@click.option("--quiet", "-q", is_flag=True, help="No progress line and no summary.")
@RUN_OPTIONS["max_memory"].option()
@RUN_OPTIONS["compression"].option()
@RUN_OPTIONS["detail"].option()
@RUN_OPTIONS["link_bin_ns"].option()
@RUN_OPTIONS["fail"].option()
@RUN_OPTIONS["pipe_intervals"].option()
@RUN_OPTIONS["fabric_model"].option()
@RUN_OPTIONS["retime"].option()
@reports_errors
def run(trace, output, system, overrides, engine, quiet, max_memory, compression, detail, link_bin_ns, fail,
        pipe_intervals, fabric_model, retime):
    """Replay TRACE (JSON or JSONL, see docs/trace-format.md) and write an HDF5 timeline."""
    from cmemu.run.pipeline import run_trace

    if output is None:
        stem = trace.name.removesuffix(".jsonl").removesuffix(".json")
        output = Path(stem + ".h5")
    t0 = time.perf_counter()
    r = run_trace(trace, system=system, overrides=overrides, output=output,
                  native=(engine == "native"), progress=not quiet, max_memory_bytes=max_memory,
                  compression=compression, detail=detail, link_bin_ns=link_bin_ns, fail=fail,
                  pipe_intervals=pipe_intervals, fabric_model=fabric_model, retime=retime)
    total_s = time.perf_counter() - t0
    if quiet:
        return
    L = r.lowered
    by_type = {}
    from cmemu.vocab import NODE_TYPES

    for code in L.op_type:
        by_type[NODE_TYPES[code]] = by_type.get(NODE_TYPES[code], 0) + 1
    types = ", ".join(f"{k} {v:,}" for k, v in sorted(by_type.items()))
    simulating_s = r.wall_time_s - r.compile_s  # the kernels' first compile is no part of the rate
    rate = r.events / simulating_s if simulating_s > 0 else float("inf")
    click.echo(f"cmemu run {trace} on {r.spec.name} ({r.spec.dies} dies)")
    click.echo(f"  simulated time  {r.sim_end_ps / 1e6:,.3f} us")
    click.echo(f"  ops             {L.num_ops:,} ({types})")
    click.echo(f"  messages        {r.fabric_messages:,} ({r.fabric_packets:,} packets, {r.fabric_bytes:,} B, "
               f"{r.packets_sent:,} packet-hops), collectives' included; {r.fabric_model}-level fabric")
    click.echo(f"  events          {r.events:,} (at most {r.max_pending_events:,} pending)")
    compiling = f"; {r.compile_s:.1f} s of it compiling kernels, first run only" if r.compile_s >= 0.05 else ""
    click.echo(f"  wall time       {r.wall_time_s:.3f} s ({rate / 1e6:.2f} M events/s{compiling}); "
               f"{total_s:.3f} s with the timeline written")
    click.echo(f"  timeline        {output}")
    if r.retime is not None:
        click.echo(f"  {r.retime.line()}")


@main.command()
@_system_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (units in the keys).")
@reports_errors
def topo(system, overrides, as_json):
    """Print the wiring of a system: dies, CPUs, switch chips, links, L2 ports, bisection."""
    from cmemu.spec import load_system
    from cmemu.topology import build_topology

    s = build_topology(load_system(system or DEFAULT_SYSTEM, overrides)).summary()
    if as_json:
        click.echo(json.dumps(s, indent=2))
        return
    click.echo(f"system {s['system']}")
    rows = [
        ("nodes", f"{s['nodes']}"),
        ("NPUs / dies", f"{s['npus']} / {s['dies']}"),
        ("CPUs", f"{s['cpus']}"),
        ("sub-planes", f"{s['sub_planes']}"),
        ("L1 switch chips", f"{s['l1_chips']} ({s['sub_planes']} per node)"),
        ("L2 switch chips", f"{s['l2_chips']} ({s['l2_chips_per_sub_plane']} per sub-plane)"),
        ("directed links", f"{s['links_directed']:,}"),
        ("L2 ports used", f"{s['l2_ports_used']:,} of {s['l2_ports_available']:,} "
                          f"({s['l2_port_utilisation_percent']:.1f}%)"),
        ("UB link rate", f"{s['ub_link_rate_gbyte_per_s']:.1f} GB/s per direction"),
        ("UB per die", f"{s['die_ub_bandwidth_gbyte_per_s']:.1f} GB/s per direction"),
        ("uplink per node", f"{s['node_uplink_bandwidth_gbyte_per_s']:,.1f} GB/s per direction"),
        ("bisection", f"{s['bisection_bandwidth_gbyte_per_s']:,.1f} GB/s per direction"),
    ]
    for k, v in rows:
        click.echo(f"  {k:<17} {v}")
    click.echo("  links by kind")
    for k, v in s["links_by_kind"].items():
        click.echo(f"    {k:<20} {v:,}")


class _ScenarioGroup(click.Group):
    """Scenarios load on demand from cmemu.scenarios.SCENARIOS."""

    def list_commands(self, ctx):
        from cmemu.scenarios import SCENARIOS

        return sorted(SCENARIOS)

    def get_command(self, ctx, name):
        from cmemu.scenarios import SCENARIOS, load_command

        return load_command(name) if name in SCENARIOS else None


@main.group()
def scenario():
    """Named experiments (the paper's, as commands)."""


@scenario.command("list")
def scenario_list():
    """List the scenarios."""
    from cmemu.scenarios import SCENARIOS

    for name, (_module, text) in sorted(SCENARIOS.items()):
        click.echo(f"{name:<12} {text}")


@scenario.group("run", cls=_ScenarioGroup)
def scenario_run():
    """Run a scenario: cmemu scenario run NAME [OPTIONS] (see `cmemu scenario list`)."""


@main.group()
def trace():
    """Work with trace files (docs/trace-format.md)."""


@trace.command("validate")
@click.argument("path", metavar="TRACE", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--system", "-s", default=None, metavar="NAME",
              help="Check ranks against this preset [default: the trace's system, else cloudmatrix384].")
@click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
              help="Override a spec field, as for `cmemu run` (repeatable).")
@RUN_OPTIONS["max_memory"].option(
    help="The memory limit `cmemu run --max-memory` would have [default: 3/4 of physical memory].")
@RUN_OPTIONS["link_bin_ns"].option(type=float, help="As for `cmemu run` (the binned series' memory depends on it).")
@RUN_OPTIONS["detail"].option(help="As for `cmemu run`.")
@RUN_OPTIONS["fail"].option(help="As for `cmemu run` (repeatable).")
@RUN_OPTIONS["fabric_model"].option(help="As for `cmemu run`.")
@reports_errors
def trace_validate(path, system, overrides, max_memory, link_bin_ns, detail, fail, fabric_model):
    """Check TRACE as `cmemu run` would before it simulates: every problem, one line each.

    Each line names the file, the node and the field; exit status 2 if there is any problem,
    otherwise one line "ok: N nodes, M messages". Beyond the trace's own problems: cores and
    op sizes against the system's die, the fault schedule against its parts, the memory the run
    needs and the clock's range (one line, "cmemu: error: ...", once the nodes are valid).
    """
    from cmemu.errors import TraceError
    from cmemu.run.pipeline import prepare_run

    try:
        prep = prepare_run(path, system=system, overrides=overrides, max_memory_bytes=max_memory, detail=detail,
                           link_bin_ns=link_bin_ns, fail=fail, fabric_model=fabric_model)
    except TraceError as exc:
        problems = getattr(exc, "problems", None) or [exc]
        sys.stderr.write("".join(f"{one_line(e)}\n" for e in problems))
        sys.exit(EXIT_INPUT_ERROR)
    nodes = prep.trace.nodes
    messages = sum(1 for node in nodes if node.type == "COMM_SEND")
    click.echo(f"ok: {len(nodes)} nodes, {messages} messages ({prep.spec.name}, {prep.spec.dies} dies)")


@trace.group("import")
def trace_import():
    """Make a cmemu trace from another tool's traces (docs/trace-format.md, "Importers")."""


@trace_import.command("ascend")
@click.argument("profiler_dir", metavar="PROFILER_DIR", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Trace file to write (.json, or .jsonl for one node per line).")
@_system_options
@click.option("--step", default=None, metavar="ID", help="Only the kernels of this step (the 'Step Id' column).")
@click.option("--deps", type=click.Choice(["time", "stream"]), default="time", show_default=True,
              help="time: stream order, and across a rank's streams the measured order (a node waits for what had "
                   "ended when it started); stream: stream order only.")
@reports_errors
def trace_import_ascend(profiler_dir, output, system, overrides, step, deps):
    """Import torch_npu (ASCEND_PROFILER_OUTPUT) or msprof (mindstudio_profiler_output) profiles, one rank or many."""
    from cmemu.importers import import_ascend_to_file
    from cmemu.output.atomic import check_output
    from cmemu.spec import load_system

    check_output(output)
    spec = load_system(system or DEFAULT_SYSTEM, overrides)
    result = import_ascend_to_file(profiler_dir, output, spec, step=step, deps=deps)
    for line in result.summary_lines(output):
        click.echo(line)


@trace_import.command("chakra")
@click.argument("prefix", metavar="PREFIX")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Trace file to write (.json, or .jsonl for one node per line).")
@_system_options
@reports_errors
def trace_import_chakra(prefix, output, system, overrides):
    """Import a Chakra execution trace: PREFIX.0.et, PREFIX.1.et, ... (one file per rank; needs cmemu[chakra])."""
    from cmemu.importers import import_chakra_to_file
    from cmemu.output.atomic import check_output

    check_output(output)
    for line in import_chakra_to_file(prefix, output, system, overrides):
        click.echo(line)


@trace.group("export")
def trace_export():
    """Write a cmemu trace in another tool's format."""


@trace_export.command("chakra")
@click.argument("path", metavar="TRACE", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", "prefix", required=True, metavar="PREFIX",
              help="Write PREFIX.0.et, PREFIX.1.et, ...: one Chakra execution trace per rank.")
@_system_options
@reports_errors
def trace_export_chakra(path, prefix, system, overrides):
    """Export TRACE as Chakra execution traces, one file per rank (needs cmemu[chakra])."""
    from cmemu.importers import export_chakra

    for line in export_chakra(path, prefix, system, overrides):
        click.echo(line)


@trace.group("gen")
def trace_gen():
    """Generate traces of model workloads."""


def _generator_command(gen):
    """The `cmemu trace gen NAME` command of a generator of cmemu.generators."""

    @reports_errors
    def command(system, overrides, output, **options):
        from cmemu.output.atomic import atomic_open, check_output
        from cmemu.spec import load_system
        from cmemu.trace.writer import write_trace

        check_output(output)  # before the work: a target that cannot be written should not cost it
        doc, what = gen.build(load_system(system or DEFAULT_SYSTEM, overrides), **options)
        with atomic_open(output, "w", encoding="utf-8") as f:
            write_trace(doc, f, jsonl=output.suffix == ".jsonl")
        click.echo(f"wrote {output}: {len(doc['nodes']):,} nodes, {what}")

    command.__doc__ = gen.help
    command = click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
                           help="Trace file to write (.json, or .jsonl for one node per line).")(command)
    for i, option in reversed(list(enumerate(gen.options))):
        command = option.option()(command)
        if i == gen.system_options_at:
            command = _system_options(command)
    return click.command(gen.name)(command)


for _gen in GENERATORS.values():
    trace_gen.add_command(_generator_command(_gen))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (the descriptions and counts).")
@reports_errors
def models(as_json):
    """List the shipped model descriptions (Hugging Face configs) with their parameter counts."""
    from cmemu.models.description import format_count, load_model, shipped_models

    rows = []
    for name, entry in shipped_models().items():
        m = load_model(name)
        rows.append({**m.summary(), "title": entry["title"], "card": entry["card"],
                     "card_total_params": entry["card_total_params"],
                     "card_activated_params": entry["card_activated_params"],
                     "card_counts_mtp": entry["card_counts_mtp"]})
    if as_json:
        click.echo(json.dumps({"models": rows}, indent=2))
        return
    click.echo(f"{'name':<17} {'attention':<10} {'layers':>6} {'experts':>12} {'params':>8} {'activated':>9} "
               f"{'MTP':>6} {'card':>6}")
    for r in rows:
        attn = (f"MLA {r['query_heads']}h" if r["attention"] == "mla"
                else f"GQA {r['query_heads']}/{r['kv_heads']}")
        experts = (f"{r['routed_experts']}+{r['shared_experts']} top{r['experts_per_token']}" if r["routed_experts"]
                   else "dense")
        click.echo(f"{r['name']:<17} {attn:<10} {r['layers']:>6} {experts:>12} {format_count(r['params']):>8} "
                   f"{format_count(r['activated_params']):>9} "
                   f"{format_count(r['mtp_params']) if r['mtp_params'] else '-':>6} {r['card_total_params']:>6}")
    click.echo("params: weights of the model without its MTP module (the cards' totals count none); "
               "any other config: cmemu trace gen model CONFIG.json")


@main.command()
@reports_errors
def presets():
    """List the shipped system presets."""
    from cmemu.spec import list_presets, load_system

    for name in list_presets():
        click.echo(f"{name:<20} {load_system(name).description}")


@main.group()
def export():
    """Convert a timeline for other tools."""


@export.command("perfetto")
@click.argument("timeline", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Trace to write [default: TIMELINE's name with .json.gz].")
@click.option("--window", default=None, metavar="START_US:END_US",
              help="Keep only events that overlap this time window (microseconds).")
@click.option("--max-events", type=click.IntRange(min=1), default=2_000_000, show_default=True,
              help="Refuse to write more events than this (viewers slow down beyond a few million).")
@reports_errors
def export_perfetto_cmd(timeline, output, window, max_events):
    """Write TIMELINE as Chrome trace-event JSON (gzipped) for ui.perfetto.dev: one process per
    die, one thread per stream and pipe, flow arrows send -> receive, link bandwidth counters."""
    from cmemu.output.perfetto import export_perfetto

    if output is None:
        output = Path(timeline.name.removesuffix(".h5") + ".json.gz")
    info = export_perfetto(timeline, output, max_events=max_events, window=window)
    click.echo(f"wrote {output}: {info.events:,} events ({info.op_events:,} ops, {info.task_events:,} tasks, "
               f"{info.flows:,} flows, {info.counter_events:,} counter samples"
               + (f", {info.packet_events:,} packets" if info.packet_events else "") + "), "
               f"{output.stat().st_size / 1e6:,.2f} MB")
    if info.window_ps is not None:
        click.echo(f"  window {info.window_ps[0] / 1e6:,.3f} to {info.window_ps[1] / 1e6:,.3f} us: "
                   f"kept {info.timed_events:,} of {info.timed_events_total:,} timed events")


@main.command()
@click.argument("timeline", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--plots", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Also write PNG plots into DIR (created if needed).")
@click.option("--window", default=None, metavar="START_US:END_US",
              help="Time window of the Gantt chart (microseconds) [default: the whole run].")
@click.option("--dies", "dies", default=None, metavar="LIST",
              help="Dies in the Gantt chart, e.g. 0,1,16 or 0-3 [default: the first four].")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON document.")
@reports_errors
def report(timeline, plots, window, dies, as_json):
    """Summarise TIMELINE: makespan, time per op type, exposed communication, link and HBM
    utilisation, the ten busiest links; with --plots, a Gantt chart, link utilisation, op types."""
    from cmemu.output.report import run_report

    run_report(timeline, plots_dir=plots, window=window, dies=dies, as_json=as_json, echo=click.echo)


@main.command("sweep")
@click.argument("sweep_file", metavar="SWEEP.toml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Results folder [default: SWEEP's name with -results, in the current folder].")
@click.option("--scheduler", metavar="ADDRESS", default=None,
              help="A running Dask scheduler, e.g. tcp://host:8786 [default: a local cluster].")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes of the local cluster [default: one per core].")
@click.option("--dry-run", is_flag=True, help="List the points and which are finished; run nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary table.")
def sweep_cmd(sweep_file, output, scheduler, workers, dry_run, quiet):
    """Run every point of SWEEP.toml (docs/sweep-format.md) as a job on a Dask cluster; skip
    points finished before; write DIR/points/KEY/ per point and DIR/summary.csv, summary.h5.
    Exit status 2 if the file is bad or any point failed (the others still run)."""
    _sweep(sweep_file, output, scheduler, workers, dry_run, quiet)


@reports_errors
def _sweep(sweep_file, output, scheduler, workers, dry_run, quiet):
    from cmemu.sweep import load_sweep, point_status, run_sweep
    from cmemu.sweep.summary import format_summary, summary_parameters

    if scheduler is not None and workers is not None:
        raise CmemuError("--workers sets the size of the local cluster; with --scheduler the cluster "
                         "has its own workers")
    sw = load_sweep(sweep_file)
    if output is None:
        output = Path(sweep_file.name.removesuffix(".toml") + "-results")
    if dry_run:
        for p in sw.points:
            label = ", ".join(f"{k}={v}" for k, v in p.parameters.items()) or "(no varied parameters)"
            click.echo(f"{p.key}  {point_status(output, p):<6}  {label}")
        click.echo(f"{len(sw.points)} points; results would go to {output}")
        return
    try:
        r = run_sweep(sw, output, scheduler=scheduler, workers=workers, progress=not quiet)
    except KeyboardInterrupt as exc:
        interrupted_exit(exc, f"finished points are kept in {output}, and a re-run skips them")
    ran = f"{r.ran} run" + (f" on {scheduler}" if scheduler else f" on {r.workers} local workers" if r.ran else "")
    click.echo(f"sweep {sweep_file}: {len(r.outcomes)} points: {ran}, {r.skipped} skipped (finished before), "
               f"{len(r.failed)} failed; {r.wall_time_s:.1f} s")
    text = format_summary(r.rows, r.columns, summary_parameters(sw), sw.print_columns)
    if text and not quiet:
        click.echo(text)
    produced = {t for o in r.outcomes.values() if o["status"] == "ok" for t in o["tables"]}
    unknown = [t for t in sw.tables or () if t not in produced]
    if unknown and produced:
        click.echo(f"note: [summary] tables names {', '.join(map(repr, unknown))}, which no point produced "
                   f"(tables: {', '.join(map(repr, sorted(produced)))})")
    click.echo(f"results in {output}/ (summary.csv, summary.h5, points/)")
    if r.failed:
        first = r.outcomes[r.failed[0]]["error"]
        raise CmemuError(f"{len(r.failed)} of {len(r.outcomes)} points failed, e.g. {r.failed[0]}: {first}")


if __name__ == "__main__":
    main()
