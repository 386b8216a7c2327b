"""Sweep files (docs/sweep-format.md): TOML in, a checked list of resolved points out.

A point is one run: a scenario (by name, through ``cmemu.scenarios.run_scenario``), a trace
(through ``cmemu.run.run_trace``) or a trace generated for the point (a generator of
``cmemu.generators``, as `cmemu trace gen` offers) and then replayed, a system preset, ``--set`` overrides and the run's options,
all resolved (defaults filled in). Its key is a hash of that configuration and the cmemu version,
so the same configuration always lands in the same results folder, whichever sweep asked for it.

Everything that can be checked without running is checked here, and each problem is one
CmemuError naming the file and the key. Values only a run can judge (an override out of range,
more all-to-all dies than the system has) fail that point alone, when it runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path

from cmemu.errors import CmemuError

TOP_KEYS = ("description", "scenario", "trace", "generator", "system", "options", "set", "grid", "zip", "summary")
RANGE_KEYS = frozenset({"start", "stop", "step", "factor"})
MAX_POINTS = 100_000
# Options of `cmemu run` a trace sweep may fix or vary, and the run_trace() argument each becomes.
TRACE_OPTIONS = {"engine": "native", "detail": "detail", "compression": "compression",
                 "link_bin_ns": "link_bin_ns", "max_memory": "max_memory_bytes"}


class SweepFileError(CmemuError):
    """A sweep file is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class Point:
    """One run of a sweep. ``config`` is what the key hashes; ``parameters`` are the values the
    sweep varied to reach it (labels for the summary, not part of the key)."""

    key: str
    parameters: dict
    config: dict
    trace_path: str | None = None  # where the worker reads the trace (the config holds its hash)


@dataclass(frozen=True)
class Sweep:
    path: Path
    text: str
    description: str
    kind: str  # "scenario", "trace" or "generator"
    target: str  # the scenario's name, the trace's path or the generator's name
    axes: tuple  # ((keys, [value tuples]), ...) in product order, the first varying slowest
    points: tuple
    tables: tuple | None  # the result tables the summary keeps (None: all)
    print_columns: tuple | None  # the figures the printed summary shows (None: a default choice)

    @property
    def parameter_names(self) -> list[str]:
        return [k for keys, _ in self.axes for k in keys]


# Options a scenario gained after sweeps of it were keyed, with the value that means what the
# scenario did before them: a point's key leaves them out while they hold it, so that a re-run
# still finds the points it finished (the run itself gets every option).
KEY_NEUTRAL_OPTIONS = {
    ("scenario", "decode"): {"model_name": "deepseek-r1", "attn_tp": 1},
    ("scenario", "prefill"): {"model_name": "deepseek-r1"},
}


def keyed_config(config: dict) -> dict:
    """``config`` without the options of KEY_NEUTRAL_OPTIONS that hold their neutral value."""
    neutral = KEY_NEUTRAL_OPTIONS.get(("scenario", config["scenario"]), {}) if config.get("kind") == "scenario" else {}
    options = {k: v for k, v in config.get("options", {}).items() if k not in neutral or neutral[k] != v}
    return {**config, "options": options} if neutral else config


def point_key(config: dict) -> str:
    """The folder name of a point: 16 hex digits of the SHA-256 of its canonical JSON."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_sweep(path) -> Sweep:
    """Read, check and expand a sweep file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SweepFileError(f"{path}: cannot read the sweep file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        data = path.read_bytes()
        line = data.count(b"\n", 0, exc.start) + 1
        raise SweepFileError(f"{path}: not a sweep file: not UTF-8 text (invalid byte at line {line})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SweepFileError(f"{path}: not valid TOML: {exc}") from None
    return _Checker(path, text, doc).sweep()


class _Checker:
    """Checks a parsed sweep file part by part, in the order a reader meets them, and expands it
    into points; ``fail`` raises the one error, naming the file and the key."""

    def __init__(self, path: Path, text: str, doc: dict):
        self.path, self.text, self.doc = path, text, doc

    def fail(self, where: str, message: str):
        raise SweepFileError(f"{self.path}: {where}: {message}")

    # -- the file's parts -----------------------------------------------------------------
    def sweep(self) -> Sweep:
        doc = self.doc
        for key in doc:
            if key not in TOP_KEYS:
                self.fail(key, f"unknown key (known: {', '.join(TOP_KEYS)})")
        description = doc.get("description", "")
        if not isinstance(description, str):
            self.fail("description", "must be a string")
        kind, target, trace_sha = self.target()
        self.allowed = self.options_of(kind, target)
        fixed_system = doc.get("system")
        if fixed_system is not None:
            self.check_system("system", fixed_system)
        fixed_set = self.flat_table("set", leaves="values")
        for k in fixed_set:
            self.check_spec_path(f"set.{k}", k)
        fixed_options = {}
        for k, v in self.flat_table("options", leaves="values").items():
            name = self.option_name(f"options.{k}", k)
            fixed_options[name] = self.convert_option(f"options.{k}", name, v)
        axes = self.axes()
        varied = [k for keys, _ in axes for k in keys]
        for k in varied:
            what, name = self.classify(k)
            if what == "system" and fixed_system is not None:
                self.fail("system", "is both fixed (top-level 'system') and varied; keep one")
            if what == "set" and name in fixed_set:
                self.fail(f"set.{name}", f"is both fixed in [set] and varied as '{k}'; keep one")
            if what == "option" and name in fixed_options:
                self.fail(f"options.{name}", f"is both fixed in [options] and varied as '{k}'; keep one")
        count = math.prod(len(values) for _, values in axes)
        if count > MAX_POINTS:
            self.fail("grid", f"the sweep has {count:,} points, more than {MAX_POINTS:,}; split it")
        points = []
        for combo in itertools.product(*(values for _, values in axes)):
            parameters = {}
            for (keys, _), values in zip(axes, combo):
                parameters.update(zip(keys, values))
            points.append(self.point(kind, target, trace_sha, fixed_system, fixed_set, fixed_options, parameters))
        tables, print_columns = self.summary()
        return Sweep(self.path, self.text, description, kind, target, tuple(axes), tuple(points), tables,
                     print_columns)

    def target(self):
        doc = self.doc
        given = [k for k in ("scenario", "trace", "generator") if k in doc]
        if len(given) != 1:
            self.fail("scenario", "give exactly one of 'scenario' (a name from `cmemu scenario list`), "
                                  "'trace' (a trace file) or 'generator' (from `cmemu trace gen --help`)")
        key = given[0]
        value = doc[key]
        if not isinstance(value, str) or not value:
            self.fail(key, "must be a non-empty string")
        if key == "scenario":
            from cmemu.scenarios import SCENARIOS

            if value not in SCENARIOS:
                self.fail("scenario", f"unknown scenario '{value}' (known: {', '.join(sorted(SCENARIOS))})")
            return "scenario", value, None
        if key == "generator":
            from cmemu.generators import GENERATORS as known

            if value not in known:
                self.fail("generator", f"unknown trace generator '{value}' (known: {', '.join(sorted(known))})")
            return "generator", value, None
        trace = Path(value)
        if not trace.is_absolute():
            trace = self.path.parent / trace  # relative to the sweep file, not the current folder
        try:
            data = trace.read_bytes()
        except OSError as exc:
            self.fail("trace", f"cannot read '{trace}': {exc.strerror or exc}")
        return "trace", str(trace.resolve()), hashlib.sha256(data).hexdigest()

    def options_of(self, kind: str, target: str) -> dict:
        """The click parameters a point may set, by Python name (the command's own types and
        defaults; one definition of each option)."""
        if kind == "scenario":
            from cmemu.scenarios import load_command

            try:
                params = load_command(target).params
            except ImportError as exc:
                self.fail("scenario", f"scenario '{target}' cannot be loaded: {exc}")
            from cmemu.scenarios.common import COMMON_OPTIONS

            return {p.name: p for p in params if p.name not in COMMON_OPTIONS}
        from cmemu.options import RUN_OPTIONS

        allowed = {name: o.param() for name, o in RUN_OPTIONS.items() if name in TRACE_OPTIONS}
        if kind == "generator":
            # The generator's own options, then those of the run of what it generated.
            from cmemu.generators import GENERATORS

            for p in GENERATORS[target].params().values():
                if p.name in allowed:
                    self.fail("generator", f"option '{p.name}' of generator '{target}' has the name of "
                                           "an option of the trace run")
                allowed[p.name] = p
        return allowed

    def option_name(self, where: str, key: str) -> str:
        """An option by its Python name (``a2a_dies``, ``ops``) or its flag (``a2a-dies``, ``op``)."""
        for name, param in self.allowed.items():
            flags = {o.lstrip("-").replace("-", "_") for o in param.opts if o.startswith("--")}
            if key.replace("-", "_") == name or key.replace("-", "_") in flags:
                return name
        what = (f"scenario '{self.doc['scenario']}'" if "scenario" in self.doc
                else f"generator '{self.doc['generator']}' (or the run of its trace)" if "generator" in self.doc
                else "the trace run")
        self.fail(where, f"{what} has no option '{key}' (options: {', '.join(sorted(self.allowed))}; "
                         "spec fields are written with their path, e.g. ub.link_rate_gbit_per_s or set.nodes)")

    def convert_option(self, where: str, name: str, value):
        import click

        param = self.allowed[name]
        if isinstance(value, (dict, list)):
            self.fail(where, f"an option takes one value, got {type(value).__name__}")
        try:
            converted = param.type.convert(value, param, None)
        except click.ClickException as exc:
            self.fail(where, exc.format_message())
        if name == "max_memory" and converted is not None and not isinstance(converted, int):
            self.fail(where, f"expects a memory size such as 2GB, got {value!r}")
        return converted

    def check_system(self, where: str, value):
        from cmemu.spec import list_presets

        if not isinstance(value, str):
            self.fail(where, f"a system is a preset name, got {value!r}")
        known = list_presets("system")
        if value not in known:
            self.fail(where, f"unknown system preset '{value}' (known: {', '.join(known)})")

    def check_spec_path(self, where: str, path: str):
        """A path --set accepts: a top-level field (``nodes``) or section.field (``ub.x``)."""
        from cmemu.spec.model import SystemSpec

        hints = typing.get_type_hints(SystemSpec)
        top = {f.name for f in dataclasses.fields(SystemSpec)} - {"name", "description", "sources"}
        parts = path.split(".")
        if len(parts) == 1 and parts[0] in top and not dataclasses.is_dataclass(hints[parts[0]]):
            return
        if len(parts) == 2 and parts[0] in top and dataclasses.is_dataclass(hints[parts[0]]):
            fields = {f.name for f in dataclasses.fields(hints[parts[0]])} - {"sources"}
            if parts[1] in fields:
                return
            self.fail(where, f"no spec field '{path}' (see the [{parts[0]}] table of a preset)")
        sections = sorted(k for k in top if dataclasses.is_dataclass(hints[k]))
        self.fail(where, f"no spec field '{path}' (a path is section.field with section one of "
                         f"{', '.join(sections)}, or a top-level field such as nodes)")

    def flat_table(self, name: str, leaves: str) -> dict:
        """A table with nested tables flattened to dotted keys (TOML reads ``ub.x = 1`` as a
        nested table). With ``leaves="axes"`` a range table ({start, stop, ...}) is a leaf."""
        table = self.doc.get(name, {})
        if not isinstance(table, dict):
            self.fail(name, "must be a table")
        return self._flatten(table, name, leaves)

    def _flatten(self, table: dict, where: str, leaves: str, prefix: str = "") -> dict:
        out = {}
        for key, value in table.items():
            full = f"{prefix}{key}"
            if isinstance(value, dict) and not (leaves == "axes" and "start" in value):
                if not value:
                    self.fail(f"{where}.{full}", "an empty table")
                out.update(self._flatten(value, where, leaves, full + "."))
            else:
                out[full] = value
        return out

    # -- what varies --------------------------------------------------------------------
    def axes(self):
        axes = []
        seen = {}
        grid = self.flat_table("grid", leaves="axes")
        for key, spec in grid.items():
            where = f"grid.{key}"
            self.check_axis_key(where, key, seen)
            axes.append(((key,), [(v,) for v in self.values(where, key, spec)]))
        zips = self.doc.get("zip", [])
        if isinstance(zips, dict):
            zips = [zips]
        if not isinstance(zips, list) or not all(isinstance(z, dict) for z in zips):
            self.fail("zip", "must be tables: [[zip]] (one per group of keys varied together)")
        for i, z in enumerate(zips):
            group = self._flatten(z, f"zip[{i}]", "axes")
            if not group:
                self.fail(f"zip[{i}]", "an empty group")
            columns = []
            for key, spec in group.items():
                where = f"zip[{i}].{key}"
                self.check_axis_key(where, key, seen)
                columns.append(self.values(where, key, spec))
            lengths = {len(c) for c in columns}
            if len(lengths) > 1:
                sizes = ", ".join(f"{k} {len(c)}" for k, c in zip(group, columns))
                self.fail(f"zip[{i}]", f"zipped keys need as many values each, got {sizes}")
            axes.append((tuple(group), list(zip(*columns))))
        return axes

    def check_axis_key(self, where: str, key: str, seen: dict):
        what, name = self.classify(key)
        canonical = f"{what}:{name}"
        if canonical in seen:
            self.fail(where, f"varied twice (also as {seen[canonical]})")
        seen[canonical] = where
        if what == "set":
            self.check_spec_path(where, name)
        elif what == "option":
            self.option_name(where, key)

    def classify(self, key: str):
        """``system``; a spec path (``ub.x``, or ``set.nodes`` for a top-level field); else an
        option of the scenario (or of the trace run)."""
        if key == "system":
            return "system", "system"
        if key.startswith("set."):
            return "set", key[4:]
        if "." in key:
            return "set", key
        return "option", self.option_name(f"grid.{key}", key) if self.allowed else key

    def values(self, where: str, key: str, spec) -> list:
        if isinstance(spec, dict):
            values = self.range_values(where, spec)
        elif isinstance(spec, list):
            values = spec
        else:
            self.fail(where, f"a varied key takes a list or a range {{start, stop, step}}, got {spec!r}; "
                             "a single value belongs in [options] or [set]")
        if not values:
            self.fail(where, "no values")
        what, name = self.classify(key)
        for v in values:
            if isinstance(v, (dict, list)):
                self.fail(where, f"each value must be a number, string or boolean, got {v!r}")
            if what == "system":
                self.check_system(where, v)
        if what == "option":
            values = [self.convert_option(where, name, v) for v in values]
        if len({json.dumps(v) for v in values}) != len(values):
            self.fail(where, "a value appears twice")
        return values

    def range_values(self, where: str, spec: dict) -> list:
        """``{start, stop, step}``: start, start + step, ... up to stop inclusive;
        ``{start, stop, factor}``: start, start x factor, ... up to stop inclusive."""
        unknown = set(spec) - RANGE_KEYS
        if unknown:
            self.fail(where, f"unknown range key(s) {', '.join(sorted(unknown))} (a range is "
                             "{start, stop, step} or {start, stop, factor})")
        for k in ("start", "stop"):
            if k not in spec:
                self.fail(where, f"a range needs '{k}'")
        if ("step" in spec) == ("factor" in spec):
            self.fail(where, "a range needs exactly one of 'step' or 'factor'")
        for k, v in spec.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                self.fail(f"{where}.{k}", f"must be a finite number, got {v!r}")
        start, stop = spec["start"], spec["stop"]
        exact = all(isinstance(v, int) for v in spec.values())
        # The number of values is worked out (in floats: a huge or tiny range may not fit an int)
        # and checked before any value is made.
        if "step" in spec:
            step = spec["step"]
            if step == 0 or (stop - start) * step < 0:
                self.fail(f"{where}.step", f"must be non-zero and lead from start {start} to stop {stop}")
            count = (stop - start) // step + 1 if exact else _count((stop - start) / step)
            self.check_count(where, count)
            n = int(count)
            values = (start + i * step for i in range(n))
        else:
            factor = spec["factor"]
            if start == 0 or factor <= 0 or factor == 1 or (stop / start) <= 0 \
                    or (abs(stop) - abs(start)) * (factor - 1) < 0:
                self.fail(f"{where}.factor", f"must lead from start {start} to stop {stop} by "
                                             "multiplying (start non-zero, factor > 0 and not 1)")
            ratio = stop / start
            logs = math.log(ratio) if math.isfinite(ratio) and ratio > 0 else math.log(abs(stop)) - math.log(abs(start))
            count = _count(logs / math.log(factor))
            self.check_count(where, count)
            n = int(count)
            values = (start * factor**i for i in range(n))
        try:
            out = [v if exact else _tidy(v) for v in values]
        except OverflowError:
            out = [math.inf]
        if not all(math.isfinite(v) for v in out):
            self.fail(where, "the range's values pass what a double holds (about 1.8e308)")
        return out

    def check_count(self, where: str, n):
        if not n <= MAX_POINTS:  # a float count may be inf or NaN
            many = f"{int(n):,}" if n < 1e15 else "about {:.1e}".format(n) if n < math.inf else "too many"
            self.fail(where, f"the range has {many} values, more than {MAX_POINTS:,}")

    def summary(self):
        """``[summary]``: ``tables``, the result tables to keep; ``print``, the figures to print."""
        summary = self.doc.get("summary", {})
        if not isinstance(summary, dict):
            self.fail("summary", "must be a table")
        out = []
        for key, example in (("tables", '["all-to-all"]'), ("print", '["makespan_us"]')):
            value = summary.get(key)
            if value is not None and (not isinstance(value, list) or not value
                                      or not all(isinstance(t, str) for t in value)):
                self.fail(f"summary.{key}", f"must be a list of names, e.g. {example}")
            out.append(None if value is None else tuple(value))
        for key in summary:
            if key not in ("tables", "print"):
                self.fail(f"summary.{key}", "unknown key (known: tables, print)")
        return tuple(out)

    # -- one point ------------------------------------------------------------------------
    def point(self, kind, target, trace_sha, fixed_system, fixed_set, fixed_options, parameters) -> Point:
        from cmemu import __version__

        system = fixed_system
        overrides = dict(fixed_set)
        options = {name: _default(p) for name, p in self.allowed.items()}
        options.update(fixed_options)
        for key, value in parameters.items():
            what, name = self.classify(key)
            if what == "system":
                system = value
            elif what == "set":
                overrides[name] = value
            else:
                options[name] = value
        if kind == "scenario" and system is None:
            from cmemu.scenarios import load_command

            system = next(p.default for p in load_command(target).params if p.name == "system")
        if kind == "generator" and system is None:
            from cmemu.spec import DEFAULT_SYSTEM  # what `cmemu trace gen` uses without --system

            system = DEFAULT_SYSTEM
        config = {"cmemu_version": __version__, "kind": kind}
        if kind == "trace":
            config["trace"] = {"name": Path(target).name, "sha256": trace_sha}
        else:
            config[kind] = target
        # A trace run without a system uses the trace header's (the sha256 covers the header).
        config.update(system=system, overrides=dict(sorted(overrides.items())), options=options)
        return Point(point_key(keyed_config(config)), parameters, config, target if kind == "trace" else None)


def _default(param):
    """A click option's default as the command would see it: None for an option without one."""
    value = param.default
    if callable(value):
        value = value()
    if value is not None and not isinstance(value, (str, int, float, bool, list, tuple)):
        return None  # click's "unset" marker
    return list(value) if isinstance(value, tuple) else value


def _count(steps: float) -> float:
    """Values of a range ``steps`` steps long (a float: may be inf or NaN), the last included."""
    return math.floor(steps + 1e-9) + 1 if math.isfinite(steps) else math.inf


def _tidy(x: float) -> float:
    """0.1 + 2 * 0.1 is 0.30000000000000004: keep 12 significant digits of a float range."""
    return float(f"{x:.12g}")
