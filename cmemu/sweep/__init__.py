"""Parameter sweeps on Dask: ``cmemu sweep SWEEP.toml -o DIR`` (docs/sweep-format.md).

A sweep file names a scenario or a trace, the system, and what to vary; ``plan`` expands it into
points, each with a key hashed from its resolved configuration. Every point that has no results
yet becomes one task on a Dask ``distributed`` cluster (``cluster``), which runs ``point.run_point``
on a worker. Results land in ``DIR/points/KEY/`` as they arrive; at the end ``summary`` writes one
table of every point's parameters and figures. Dask does the scheduling; cmemu does none.

Importing this package does not import Dask (only running a sweep does).
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from cmemu.errors import CmemuError
from cmemu.output.atomic import atomic_open, check_output, output_folder
from cmemu.sweep.plan import Point, Sweep, SweepFileError, load_sweep, point_key
from cmemu.sweep.summary import read_summary

__all__ = ["Point", "Sweep", "SweepFileError", "SweepOutcome", "load_sweep", "point_key", "read_summary",
           "run_sweep", "point_status"]

POINTS_DIR = "points"
CONFIG_FILE, RESULTS_FILE, ERROR_FILE = "config.json", "results.json", "error.json"
SUMMARY_CSV, SUMMARY_HDF5 = "summary.csv", "summary.h5"


@dataclass
class SweepOutcome:
    """What a sweep did: points run now, skipped (finished before), failed (keys)."""

    sweep: Sweep
    out_dir: Path
    ran: int = 0
    skipped: int = 0
    failed: list = field(default_factory=list)
    outcomes: dict = field(default_factory=dict)  # key -> run_point's dict
    rows: list = field(default_factory=list)
    columns: list = field(default_factory=list)
    wall_time_s: float = 0.0
    workers: int = 0


def _write_json(path: Path, doc, inputs=()) -> None:
    """Whole or not at all (cmemu.output.atomic: a temporary file beside the target, renamed)."""
    with atomic_open(path, "w", inputs=inputs, encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=2, allow_nan=True) + "\n")


def _inputs(sweep: Sweep) -> tuple:
    """The files a sweep reads, which none of its outputs may replace."""
    return (sweep.path, *dict.fromkeys(p.trace_path for p in sweep.points if p.trace_path))


def point_status(out_dir, point: Point) -> str:
    """"done" (results stored), "failed" (an error stored; a re-run tries it again) or "new"."""
    folder = Path(out_dir) / POINTS_DIR / point.key
    if (folder / RESULTS_FILE).is_file():
        return "done"
    return "failed" if (folder / ERROR_FILE).is_file() else "new"


def _load_results(path: Path):
    """A point's stored results (run_point's dict), or None where there are none or they are
    unreadable or not of that shape (damaged, or edited): the point then runs again."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(doc, dict) and doc.get("status") == "ok" and isinstance(doc.get("tables"), dict)
            and isinstance(doc.get("parameters", {}), dict)
            and all(isinstance(t, list) and all(isinstance(r, dict) for r in t) for t in doc["tables"].values())):
        return None
    return doc


def run_sweep(sweep, out_dir, scheduler: str | None = None, workers: int | None = None,
              progress: bool = True) -> SweepOutcome:
    """Run every point of ``sweep`` (a Sweep or a path) that has no results in ``out_dir`` yet,
    on a LocalCluster of ``workers`` processes or on the Dask scheduler at ``scheduler``; write
    the summary. A failing point is recorded (``error.json``, the summary) and the rest go on."""
    from cmemu.sweep.cluster import default_workers
    from cmemu.sweep.summary import summary_rows, write_csv, write_hdf5

    t0 = time.perf_counter()
    if not isinstance(sweep, Sweep):
        sweep = load_sweep(sweep)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CmemuError(f"{out}: exists and is not a folder")
    # Before any point runs: the folders exist and take files, and the summary can be written.
    output_folder(out)
    inputs = _inputs(sweep)
    for name in (SUMMARY_CSV, SUMMARY_HDF5):
        check_output(out / name, inputs)
    output_folder(out / POINTS_DIR)
    result = SweepOutcome(sweep, out)
    unique = {p.key: p for p in sweep.points}
    todo = []
    for key, p in unique.items():
        stored = _load_results(out / POINTS_DIR / key / RESULTS_FILE)
        if stored is not None:
            result.outcomes[key] = stored
            result.skipped += 1
        else:
            todo.append(p)
    for p in todo:
        folder = output_folder(out / POINTS_DIR / p.key)
        _write_json(folder / CONFIG_FILE, {"key": p.key, "config": p.config, "parameters": p.parameters,
                                           "trace_path": p.trace_path}, inputs)
    if todo:
        n = min(workers or default_workers(), len(todo))
        result.workers = n if scheduler is None else 0
        _run_points(todo, out, scheduler, n, progress, result, inputs)
    rows, columns = summary_rows(sweep, result.outcomes)
    result.rows, result.columns = rows, columns
    result.failed = [k for k, o in result.outcomes.items() if o["status"] != "ok"]
    from cmemu import __version__

    write_csv(out / SUMMARY_CSV, rows, columns, inputs)
    write_hdf5(out / SUMMARY_HDF5, rows, columns, {
        "cmemu_version": __version__, "sweep_file": str(sweep.path), "sweep_toml": sweep.text,
        "points": len(unique), "failed": len(result.failed),
    }, inputs)
    result.wall_time_s = time.perf_counter() - t0
    return result


def _run_points(todo: list, out: Path, scheduler, workers: int, progress: bool, result: SweepOutcome,
                inputs=()):
    from distributed import as_completed

    from cmemu.sweep.cluster import connect
    from cmemu.sweep.point import run_point

    bar = None
    if progress:
        from tqdm.auto import tqdm

        # disable=None: a bar on a terminal, nothing in a log file
        bar = tqdm(total=len(todo), unit="point", desc="sweep", dynamic_ncols=True, disable=None)
    try:
        with connect(scheduler, workers) as client:
            tag = uuid.uuid4().hex[:8]  # a fresh Dask key per run: a re-run must not get a stale result
            futures = {}
            for p in todo:
                folder = str((out / POINTS_DIR / p.key).resolve())  # workers may run elsewhere
                fut = client.submit(run_point, p.config, p.trace_path, folder, key=f"cmemu-point-{p.key}-{tag}",
                                    retries=0)
                futures[fut] = p
            failed = 0
            for fut in as_completed(futures):
                p = futures.pop(fut)
                try:
                    outcome = fut.result()
                except Exception as exc:  # the task itself was lost: a worker died, or was killed
                    outcome = {"status": "failed", "error_type": type(exc).__name__,
                               "error": "its worker process died while running it (out of memory? a crash?): "
                                        f"{type(exc).__name__}: {exc}"}
                fut.release()
                _store(out / POINTS_DIR / p.key, outcome, inputs)
                result.outcomes[p.key] = outcome
                result.ran += 1
                failed += outcome["status"] != "ok"
                if bar is not None:
                    bar.set_postfix(failed=failed, refresh=False)
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()


def _store(folder: Path, outcome: dict, inputs=()) -> None:
    if outcome["status"] == "ok":
        _write_json(folder / RESULTS_FILE, outcome, inputs)
        (folder / ERROR_FILE).unlink(missing_ok=True)  # a retried point that now succeeds
    else:
        _write_json(folder / ERROR_FILE, outcome, inputs)
