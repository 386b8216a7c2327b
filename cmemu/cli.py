"""The ``cmemu`` command line. Every CmemuError becomes one line on stderr and exit status 2."""
from __future__ import annotations

import contextlib
import functools
import json
import signal
import sys
import threading
import time
from pathlib import Path

import click

from cmemu.errors import CmemuError
from cmemu.scenarios.common import MemorySize

EXIT_INPUT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM, as shells report a command stopped by kill or timeout


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, timeout, batch schedulers), raised where Python runs signal handlers, so
    that it unwinds and cleans up exactly as Ctrl-C does (a KeyboardInterrupt, not an Exception:
    no ``except Exception`` takes it for an error)."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raises Terminated for the block (in the main thread, where handlers run; not
    where SIGTERM was set to be ignored), then is handled as before."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def interrupted_exit(exc: KeyboardInterrupt, message: str) -> None:
    """One line ``cmemu: interrupted; MESSAGE`` (``terminated`` for SIGTERM), exit 130 or 143."""
    term = isinstance(exc, Terminated)
    click.echo(f"cmemu: {'terminated' if term else 'interrupted'}; {message}", err=True)
    sys.exit(EXIT_TERMINATED if term else EXIT_INTERRUPTED)


def _one_line(message: str) -> str:
    return " ".join(str(message).splitlines())


def _fail(message: str) -> None:
    click.echo(f"cmemu: error: {_one_line(message)}", err=True)
    sys.exit(EXIT_INPUT_ERROR)


def reports_errors(fn):
    """Turn CmemuError (bad trace, bad preset, blocked run, unwritable output) into one line and
    exit status 2, and Ctrl-C (SIGTERM) into one line and exit status 130 (143). Output files
    are only ever renamed into place when complete (cmemu.output.atomic), so an interrupted
    command leaves none; the line names any it had renamed into place before the interrupt."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from cmemu.output.atomic import COMMITTED

        before = len(COMMITTED)
        try:
            with sigterm_as_interrupt():
                return fn(*args, **kwargs)
        except CmemuError as exc:
            _fail(str(exc))
        except KeyboardInterrupt as exc:
            written = COMMITTED[before:]
            interrupted_exit(exc, f"wrote {', '.join(map(str, written))} before it" if written
                             else "no output written")

    return wrapper


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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cmemu")
def main():
    """cmemu: a cycle-approximate emulator of the Huawei CloudMatrix384 supernode."""


@main.command()
@click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="HDF5 timeline to write [default: TRACE's name with .h5, in the current folder].")
@_system_options
@click.option("--engine", type=click.Choice(["native", "reference"]), default="native", show_default=True,
              help="The Cython kernel, or its pure-Python reference (slow; for checking).")
@click.option("--quiet", "-q", is_flag=True, help="No progress line and no summary.")
@click.option("--max-memory", type=MemorySize(), default=None, metavar="SIZE",
              help="Fail early instead of swapping if the run would need more, e.g. 2GB, 512MiB "
                   "[default: 3/4 of physical memory].")
@click.option("--compression", type=click.Choice(["gzip", "lzf", "none"]), default="gzip", show_default=True,
              help="Timeline compression: gzip (with shuffle; smallest), lzf (faster), none.")
@click.option("--detail", type=click.Choice(["ops", "tasks", "packets"]), default="tasks", show_default=True,
              help="What the timeline records: ops; ops and pipe/engine tasks; packets: tasks and every "
                   "packet on every link (/packets; small runs only: a warning above 1 M records, refused "
                   "above 50 M or past --max-memory).")
@click.option("--link-bin-ns", type=click.FloatRange(min=0), default=10_000, show_default=True,
              help="Width of the time bins of the per-link byte and busy-time counters, in ns (0: off).")
@click.option("--fail", multiple=True, metavar="PART",
              help="Take a part out of service: link:ID, l1:NODE.PLANE, l2:PLANE.CHIP or die:ID (repeatable).")
@click.option("--pipe-intervals", type=click.IntRange(min=1), default=16, show_default=True,
              help="Most busy intervals per COMP op and pipe in /tasks (the die model's tile schedule merged; "
                   "fewer when a big run would pass 4 million rows).")
@click.option("--fabric", "fabric_model", type=click.Choice(["packet", "message"]), default="packet",
              show_default=True,
              help="Fabric model. packet: every packet on every link. message: a write packet's whole path is "
                   "reserved when it is issued, in each link's idle time, with no events of its own (many times "
                   "faster on big MoE steps; no credit flow control; see docs/model.md); reads stay packets.")
@reports_errors
def run(trace, output, system, overrides, engine, quiet, max_memory, compression, detail, link_bin_ns, fail,
        pipe_intervals, fabric_model):
    """Replay TRACE (JSON or JSONL, see docs/trace-format.md) and write an HDF5 timeline."""
    from cmemu.run import run_trace

    if output is None:
        stem = trace.name.removesuffix(".jsonl").removesuffix(".json")
        output = Path(stem + ".h5")
    t0 = time.perf_counter()
    r = run_trace(trace, system=system, overrides=overrides, output=output,
                  native=(engine == "native"), progress=not quiet, max_memory_bytes=max_memory,
                  compression=compression, detail=detail, link_bin_ns=link_bin_ns, fail=fail,
                  pipe_intervals=pipe_intervals, fabric_model=fabric_model)
    total_s = time.perf_counter() - t0
    if quiet:
        return
    L = r.lowered
    by_type = {}
    from cmemu.lower import OP_TYPES

    for code in L.op_type:
        by_type[OP_TYPES[code]] = by_type.get(OP_TYPES[code], 0) + 1
    types = ", ".join(f"{k} {v:,}" for k, v in sorted(by_type.items()))
    rate = r.events / r.wall_time_s if r.wall_time_s > 0 else float("inf")
    click.echo(f"cmemu run {trace} on {r.spec.name} ({r.spec.dies} dies)")
    click.echo(f"  simulated time  {r.sim_end_ps / 1e6:,.3f} us")
    click.echo(f"  ops             {L.num_ops:,} ({types})")
    click.echo(f"  messages        {r.fabric_messages:,} ({r.fabric_packets:,} packets, {r.fabric_bytes:,} B, "
               f"{r.packets_sent:,} packet-hops), collectives' included; {r.fabric_model}-level fabric")
    click.echo(f"  events          {r.events:,} (at most {r.max_pending_events:,} pending)")
    click.echo(f"  wall time       {r.wall_time_s:.3f} s ({rate / 1e6:.2f} M events/s); "
               f"{total_s:.3f} s with the timeline written")
    click.echo(f"  timeline        {output}")


@main.command()
@_system_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (units in the keys).")
@reports_errors
def topo(system, overrides, as_json):
    """Print the wiring of a system: dies, CPUs, switch chips, links, L2 ports, bisection."""
    from cmemu.run import DEFAULT_SYSTEM
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
@click.option("--max-memory", type=MemorySize(), default=None, metavar="SIZE",
              help="The memory limit `cmemu run --max-memory` would have [default: 3/4 of physical memory].")
@click.option("--link-bin-ns", type=float, default=10_000, show_default=True,
              help="As for `cmemu run` (the binned series' memory depends on it).")
@click.option("--detail", type=click.Choice(["ops", "tasks", "packets"]), default="tasks", show_default=True,
              help="As for `cmemu run`.")
@click.option("--fail", multiple=True, metavar="PART", help="As for `cmemu run` (repeatable).")
@click.option("--fabric", "fabric_model", type=click.Choice(["packet", "message"]), default="packet",
              show_default=True, help="As for `cmemu run`.")
@reports_errors
def trace_validate(path, system, overrides, max_memory, link_bin_ns, detail, fail, fabric_model):
    """Check TRACE as `cmemu run` would before it simulates: every problem, one line each.

    Each line names the file, the node and the field; exit status 2 if there is any problem,
    otherwise one line "ok: N nodes, M messages". Beyond the trace's own problems: cores and
    op sizes against the system's die, the fault schedule against its parts, the memory the run
    needs and the clock's range (one line, "cmemu: error: ...", once the nodes are valid).
    """
    from cmemu.errors import TraceError
    from cmemu.run import prepare_run

    try:
        prep = prepare_run(path, system=system, overrides=overrides, max_memory_bytes=max_memory, detail=detail,
                           link_bin_ns=link_bin_ns, fail=fail, fabric_model=fabric_model)
    except TraceError as exc:
        problems = getattr(exc, "problems", None) or [exc]
        sys.stderr.write("".join(f"{_one_line(e)}\n" for e in problems))
        sys.exit(EXIT_INPUT_ERROR)
    nodes = prep.trace.nodes
    messages = sum(1 for node in nodes if node.type == "COMM_SEND")
    click.echo(f"ok: {len(nodes)} nodes, {messages} messages ({prep.spec.name}, {prep.spec.dies} dies)")


@trace.group("gen")
def trace_gen():
    """Generate traces of model workloads."""


@trace_gen.command("deepseek-r1")
@click.option("--phase", type=click.Choice(["decode", "prefill"]), default="decode", show_default=True,
              help="Step to generate.")
@_system_options
@click.option("--ep", type=click.IntRange(min=2), default=None,
              help="EP degree [default: decode 320, or all dies if fewer; prefill 32].")
@click.option("--tokens-per-die", type=click.IntRange(min=1), default=96, show_default=True,
              help="Decode: tokens each die processes per step, speculative ones included.")
@click.option("--kv-len", type=click.IntRange(min=1), default=4096, show_default=True)
@click.option("--prompt-len", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Prefill: tokens per prompt.")
@click.option("--requests", type=click.IntRange(min=1), default=8, show_default=True,
              help="Prefill: requests per step (a multiple of micro-batches x EP / attn-tp).")
@click.option("--attn-tp", type=click.IntRange(min=2), default=8, show_default=True,
              help="Prefill: dies that split one request's attention heads (SP -> TP -> SP).")
@click.option("--reuse", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Prefill: EMS context-cache reuse rate (share of each prompt's KV fetched, not recomputed).")
@click.option("--ems-plane", type=click.Choice(["ub", "vpc", "hbm"]), default="ub", show_default=True,
              help="Prefill: where reused KV comes from: the EMS pool over UB or the VPC plane (fetch ops added, "
                   "reuse rounded down to whole blocks), or already in HBM.")
@click.option("--pool-nodes", type=click.IntRange(min=1), default=None,
              help="Prefill: nodes whose CPUs form the EMS pool [default: all].")
@click.option("--ems-fetch", type=click.Choice(["whole", "layerwise"]), default="whole", show_default=True,
              help="Prefill: the EMS fetch waited for whole before layer 0, or read and waited for layer by layer.")
@click.option("--kv-transfer", is_flag=True,
              help="Prefill: add each request's KV cache sent to its decode die over RDMA after its last layer.")
@click.option("--decode-dp", type=click.IntRange(min=1), default=320, show_default=True,
              help="Prefill with --kv-transfer: decode DP ranks (one die each, after the prefill dies).")
@click.option("--micro-batches", type=click.Choice(["1", "2"]), default="2", show_default=True)
@click.option("--mtp/--no-mtp", default=True, show_default=True)
@click.option("--mtp-acceptance", type=click.FloatRange(0, 1), default=0.7, show_default=True)
@click.option("--int8/--bf16", default=True, show_default=True, help="Weights and activations of the matmuls.")
@click.option("--dispatch-engine", type=click.Choice(["aiv", "sdma"]), default=None,
              help="MoE dispatch/combine engine [default: aiv for decode, sdma for prefill].")
@click.option("--skew", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Zipf exponent of expert popularity (0: uniform).")
@click.option("--layers", type=click.IntRange(1, 61), default=61, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--lm-head-tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Decode: dies that share the LM head's vocabulary (all-gather of the hidden states, then "
                   "an all-to-all of the logits); 1: each die holds the whole head.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Trace file to write (.json, or .jsonl for one node per line).")
@reports_errors
def trace_gen_deepseek(phase, system, overrides, ep, tokens_per_die, kv_len, prompt_len, requests, attn_tp, reuse,
                       ems_plane, pool_nodes, ems_fetch, kv_transfer, decode_dp, micro_batches, mtp, mtp_acceptance, int8, dispatch_engine, skew, layers, seed, lm_head_tp,
                       output):
    """One decode or prefill step of DeepSeek-R1 in the CloudMatrix-Infer deployment (cmemu/trace/deepseek.py)."""
    import json

    from cmemu.output.atomic import atomic_open, check_output
    from cmemu.run import DEFAULT_SYSTEM
    from cmemu.spec import load_system
    from cmemu.trace.deepseek import DecodeConfig, PrefillConfig, decode_trace
    from cmemu.trace.ems_fetch import prefill_step

    check_output(output)  # before the work: a target that cannot be written should not cost it
    spec = load_system(system or DEFAULT_SYSTEM, overrides)
    if phase == "prefill":
        cfg = PrefillConfig(ep=ep or 32, prompt_len=prompt_len, requests=requests, attn_tp=attn_tp,
                            micro_batches=int(micro_batches), int8=int8, reuse=reuse,
                            dispatch_engine=dispatch_engine or "sdma", skew=skew, layers=layers, seed=seed)
        cfg, doc = prefill_step(cfg, spec, ems_plane, pool_nodes, kv_transfer, decode_dp, ems_fetch == "layerwise")
        what = f"{cfg.requests} request(s) x {cfg.prompt_len} tokens"
        if cfg.reused_tokens:
            what += f", {cfg.reused_tokens} reused ({'in HBM' if ems_plane == 'hbm' else 'EMS over ' + ems_plane.upper()})"
    else:
        cfg = DecodeConfig(ep=ep or min(320, spec.dies), tokens_per_die=tokens_per_die, kv_len=kv_len,
                           micro_batches=int(micro_batches), mtp=mtp, mtp_acceptance=mtp_acceptance, int8=int8,
                           dispatch_engine=dispatch_engine or "aiv", skew=skew, layers=layers, seed=seed,
                           lm_head_tp=lm_head_tp)
        doc = decode_trace(cfg, spec.name, spec.dies)
        what = f"{cfg.tokens_per_die} tokens/die"
    with atomic_open(output, "w", encoding="utf-8") as f:
        if output.suffix == ".jsonl":
            f.write(json.dumps({k: v for k, v in doc.items() if k != "nodes"}) + "\n")
            for node in doc["nodes"]:
                f.write(json.dumps(node, separators=(",", ":")) + "\n")
        else:
            f.write(json.dumps({k: v for k, v in doc.items() if k != "nodes"})[:-1] + ', "nodes": [\n')
            f.write(",\n".join(json.dumps(n, separators=(",", ":")) for n in doc["nodes"]))
            f.write("\n]}\n")
    click.echo(f"wrote {output}: {len(doc['nodes']):,} nodes, {phase}, {cfg.layers} layer(s), EP{cfg.ep}, {what}")


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
