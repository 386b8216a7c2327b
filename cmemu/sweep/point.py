"""One point of a sweep, as a Dask worker runs it: a scenario, a trace replay, or a trace
generated and replayed; its results as JSON-able tables, and any error caught and returned rather
than raised (so that one failing point is a record, not the end of the sweep).

This module is what workers import; it imports the model only inside ``run_point``.
"""
from __future__ import annotations

import time
import traceback

from cmemu.errors import CmemuError

TIMELINE_NAME = "timeline.h5"
GENERATED_TRACE_NAME = "trace.json"


def run_point(config: dict, trace_path: str | None, folder: str) -> dict:
    """Run the point described by ``config`` (``cmemu.sweep.plan.Point.config``).

    Returns ``{"status": "ok", "parameters", "tables", "wall_time_s"}`` or ``{"status":
    "failed", "error", "error_type", "wall_time_s"}`` (plus ``"traceback"`` for an error that
    is not a CmemuError, i.e. a bug rather than bad input). A trace run also writes its timeline
    into ``folder``.
    """
    t0 = time.perf_counter()
    try:
        if config["kind"] == "scenario":
            parameters, tables = _run_scenario(config)
        elif config["kind"] == "generator":
            parameters, tables = _run_generator(config, folder)
        else:
            parameters, tables = _run_trace(config, trace_path, folder)
    except CmemuError as exc:
        return {"status": "failed", "error": str(exc), "error_type": type(exc).__name__,
                "wall_time_s": time.perf_counter() - t0}
    except Exception as exc:  # a bug: keep the point's record, and the traceback to report it
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__,
                "traceback": traceback.format_exc(), "wall_time_s": time.perf_counter() - t0}
    return {"status": "ok", "parameters": plain(parameters), "tables": plain(tables),
            "wall_time_s": time.perf_counter() - t0}


def _overrides(config: dict) -> list[tuple[str, object]]:
    return list(config["overrides"].items())


def _run_scenario(config: dict):
    from cmemu.scenarios import run_scenario

    name = config["scenario"]
    parameters, rows = run_scenario(name, config["system"], _overrides(config), **config["options"])
    tables = rows if isinstance(rows, dict) else {name: rows}
    return parameters, tables


def _run_trace(config: dict, trace_path: str, folder: str):
    import hashlib

    with open(trace_path, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != config["trace"]["sha256"]:
            raise CmemuError(f"{trace_path} changed since the sweep was planned; run the sweep again")
    parameters, tables = _replay(config, trace_path, folder)
    return {**parameters, "trace": trace_path}, tables


def _run_generator(config: dict, folder: str):
    """Generate the point's trace (cmemu.generators, as `cmemu trace gen` does) and replay it in
    memory (cmemu.trace.TraceDocument: no file; config.json says how to make it again, and a
    generated trace can be far larger than its timeline)."""
    from cmemu.generators import GENERATORS
    from cmemu.spec import load_system
    from cmemu.sweep.plan import TRACE_OPTIONS
    from cmemu.trace import TraceDocument

    options = {k: v for k, v in config["options"].items() if k not in TRACE_OPTIONS}
    doc, _what = GENERATORS[config["generator"]].build(load_system(config["system"], tuple(_overrides(config))),
                                                       **options)
    source = TraceDocument(doc, GENERATED_TRACE_NAME)
    del doc  # the run frees it once checked
    parameters, tables = _replay(config, source, folder)
    return {**parameters, "generator": config["generator"]}, tables


def _replay(config: dict, trace_path, folder: str):
    """Replay a trace with the timeline in the point's folder; its figures are the report's
    summary (``cmemu report --json``), flattened to one row with dotted keys."""
    from pathlib import Path

    from cmemu.output.reader import open_timeline
    from cmemu.run.pipeline import run_trace
    from cmemu.sweep.plan import TRACE_OPTIONS

    kwargs = {TRACE_OPTIONS[k]: v for k, v in config["options"].items() if k in TRACE_OPTIONS}
    kwargs["native"] = kwargs.get("native", "native") == "native"
    output = Path(folder) / TIMELINE_NAME
    r = run_trace(trace_path, system=config["system"], overrides=_overrides(config), output=output,
                  progress=False, **kwargs)
    with open_timeline(output) as t:
        row = flatten(t.summary())
    row.update(events=r.events, max_pending_events=r.max_pending_events, engine_wall_time_s=r.wall_time_s)
    return {"system": r.spec.name, "timeline": TIMELINE_NAME}, {"run": [row]}


def flatten(doc: dict, prefix: str = "") -> dict:
    """Nested figures to one row: ``{"a": {"b_us": 1}}`` -> ``{"a.b_us": 1}`` (lists are kept
    as they are; the summary writes them as JSON text)."""
    out = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def plain(v):
    """numpy scalars and arrays to Python numbers and lists, for JSON."""
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if hasattr(v, "tolist"):  # numpy scalar or array
        return plain(v.tolist())
    if isinstance(v, bytes):
        return v.decode()
    return v
