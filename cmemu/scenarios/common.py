"""What every scenario shares: the --system/--set/--json/--quiet options and one way to print results.

Results are a list of rows (dicts) whose keys carry their unit (``latency_us``,
``bandwidth_gbyte_per_s``). Text output is a table with those keys as headers; ``--json`` prints
``{"scenario", "system", "parameters", "rows"}`` as one JSON document.

Run from its command, a scenario's replays of a step (``run_doc``) show `cmemu run`'s progress line
on stderr once one has taken a while (``--quiet``: none); run from Python (``run_scenario``) or
in a sweep, none.
"""
from __future__ import annotations

import functools
import json
import math
import warnings

import click

from cmemu.clihelpers import reports_errors
from cmemu.errors import CmemuError
from cmemu.options import RUN_OPTIONS
from cmemu.output.table import format_table
from cmemu.spec.load import DEFAULT_SYSTEM

# The options every scenario command has that are not the scenario's own (run_scenario, sweeps).
COMMON_OPTIONS = frozenset({"system", "overrides", "as_json", "quiet"})
_progress = {"show": False}  # while a scenario runs from its command, without --quiet (run_doc)


def scenario_command(name: str, default_system: str = DEFAULT_SYSTEM):
    """Decorate ``fn(spec, **options) -> (parameters, rows)``: rows is a list of dicts (one
    table) or a dict of table title -> list of dicts (several tables)."""

    def wrap(fn):
        @click.command(name=name, help=fn.__doc__)
        @click.option("--system", "-s", default=default_system, show_default=True, metavar="NAME",
                      help="System preset (see `cmemu presets`).")
        @click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
                      help="Override a spec field (repeatable).")
        @click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
        @click.option("--quiet", "-q", is_flag=True, help="No progress line on stderr.")
        @functools.wraps(fn)
        def command(system, overrides, as_json, quiet, **options):
            from cmemu.spec import load_system

            @reports_errors
            def go():
                spec = load_system(system, overrides)
                _progress["show"] = not quiet
                try:
                    parameters, rows = fn(spec, **options)
                finally:
                    _progress["show"] = False
                emit(name, spec.name, parameters, rows, as_json)

            go()

        command.scenario_fn = fn  # the plain function, for run_scenario() and sweeps
        return command

    return wrap


def run_options(fn):
    """--fabric and --max-memory, as `cmemu run` has them, for the scenarios that replay a step."""
    fn = RUN_OPTIONS["max_memory"].option(
        help="Fail early instead of swapping if the run would need more, e.g. 24GB [default: 3/4 of physical memory].")(fn)
    return RUN_OPTIONS["fabric_model"].option(
        "--fabric", help="Fabric model (as `cmemu run --fabric`): message is several times faster on big EP steps.")(fn)


def emit(name: str, system: str, parameters: dict, rows, as_json: bool) -> None:
    tables = rows if isinstance(rows, dict) else {"": rows}
    if as_json:
        doc = {"scenario": name, "system": system, "parameters": parameters}
        if isinstance(rows, dict):
            doc["tables"] = tables
        else:
            doc["rows"] = rows
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"scenario {name} on {system}")
    for k, v in parameters.items():
        click.echo(f"  {k}: {v}")
    for title, table in tables.items():
        if title:
            click.echo(f"\n{title}")
        click.echo(format_table(table))


def check_positive(name: str, value, most=None) -> None:
    """--NAME is a finite number > 0 (and at most ``most``, where given)."""
    option = f"--{name.replace('_', '-')}"
    if value is None or not math.isfinite(value) or value <= 0:
        raise CmemuError(f"{option} must be a number > 0, got {value}")
    if most is not None and value > most:
        raise CmemuError(f"{option} must be at most {most:,}, got {value:,}")


def run_doc(doc: dict, spec, **options):
    """Run a trace document (a dict, as in docs/trace-format.md) on a resolved spec, in memory
    (as `cmemu run` runs the file it has read: cmemu.trace.TraceDocument). The run reads the
    document without changing it and keeps no reference to it once checked: freed then if the
    caller keeps none either."""
    from cmemu.results.pipe_tasks import PIPE_TASKS_CUT
    from cmemu.run.pipeline import run_trace
    from cmemu.trace import TraceDocument

    source = TraceDocument(doc, f"<{spec.name} scenario trace>")
    del doc
    with warnings.catch_warnings():
        if options.get("output") is None:
            # No timeline is written: that its /tasks would keep fewer pipe intervals is nothing
            # to the scenario's user (it printed on every 61-layer decode step).
            warnings.filterwarnings("ignore", message=PIPE_TASKS_CUT)
        return run_trace(source, spec=spec, progress=_progress["show"], link_bin_ns=0, **options)


def trace_doc(spec, nodes, groups=None, description=None) -> dict:
    doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": spec.name, "nodes": nodes}
    if groups:
        doc["groups"] = groups
    if description:
        doc["description"] = description
    return doc
