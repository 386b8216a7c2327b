"""``cmemu trace import ascend``: a cmemu trace from Ascend profiler output (docs/trace-format.md,
"Importing Ascend profiles"; the formats and their documentation: tests/data/ascend/README.md).

It reads, per rank, the per-kernel table of one of the two profilers:

- torch_npu's Ascend PyTorch Profiler: ``{worker}_ascend_pt/ASCEND_PROFILER_OUTPUT/kernel_details.csv``,
  the rank from ``profiler_info_{rank}.json`` beside ``ASCEND_PROFILER_OUTPUT``;
- msprof: ``PROF_*/mindstudio_profiler_output/op_summary_*.csv``, the rank from its
  ``Device_id`` column;

each recognised by its header's column names (the variants of CANN 6 to 8: ``Start Time(us)``,
``Task Start Time(us)``, ``Task Start Time`` in ns; with or without ``Stream ID``, ``Device_id``,
``Step Id``), and, where the profiler wrote them, ``communication.json`` (each communication
op's transport volume, ``op@group``), ``communication_matrix.json`` (the peers of send/receive),
the HCCL tasks of the timeline JSON (``trace_view.json``, ``msprof_*.json``: the peers when the
matrix has none) and ``profiler_metadata.json`` (``parallel_group_info``: each group's global
ranks).

Each kernel is a COMP node on its rank and stream with its measured duration
(``cmemu.duration_ns``); where its op type and shapes are an op the die model knows
(cmemu.trace.importers.ascend_ops) also with that ``cmemu.op`` and shape, for ``cmemu run
--retime``. HCCL ops become COMM_COLL / COMM_SEND / COMM_RECV. Dependencies: stream order (the
rows of one stream in order of their start) and, since the tables hold no event records, the
measured order across the streams of a rank (``deps="time"``): a node waits for the last node of
each other stream of its rank that had ended when it started.
"""
from __future__ import annotations

import csv
import re
from bisect import bisect_right
from itertools import accumulate
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path

from cmemu.trace.importers.ascend_ops import die_op, parse_dtypes, parse_shapes, tensor_bytes
from cmemu.trace.importers.common import InputFileError, Unmapped, read_json

MIB = 1 << 20  # communication.json's "Transit Size(MB)" is bytes / 1024**2 (assumed: msprof's MB)

# Canonical column -> the header names the documented variants give it, with the unit of a time.
COLUMNS = {
    "name": ("Name", "Op Name"),
    "type": ("Type", "OP Type"),
    "core": ("Accelerator Core", "Task Type"),
    "start": ("Start Time(us)", "Task Start Time(us)", "Task Start Time"),
    "duration": ("Duration(us)", "Task Duration(us)", "Task Duration"),
    "stream": ("Stream ID",),
    "device": ("Device_id", "Device ID"),
    "step": ("Step Id", "Step ID"),
    "block_dim": ("Block Dim",),
    "mix_block_dim": ("Mix Block Dim",),
    "input_shapes": ("Input Shapes",),
    "input_types": ("Input Data Types",),
    "output_shapes": ("Output Shapes",),
}
REQUIRED = ("name", "start", "duration")
# ns per unit of each time column; "Task Start Time" without a unit is in ns (CANN 6.0.1's
# op_summary reference), its "Task Duration" in us.
TIME_SCALE = {"Start Time(us)": 1000, "Task Start Time(us)": 1000, "Task Start Time": 1,
              "Duration(us)": 1000, "Task Duration(us)": 1000, "Task Duration": 1000}
ABSENT = ("", "N/A", "NA", "n/a", "-")

# Accelerator Core / Task Type -> cmemu unit ("comm": an HCCL op; "cpu": AI CPU, no cores here)
CORES = {"AI_CORE": "aic", "MIX_AIC": "aic", "AI_VECTOR_CORE": "aiv", "MIX_AIV": "aiv", "AIV": "aiv",
         "AIC": "aic", "AI_CPU": "cpu", "HCCL": "comm", "COMMUNICATION": "comm"}
# HCCL op names (hcom_allReduce__512_0_1) -> COMM_COLL comm_type, or "SEND"/"RECV"
HCCL_KINDS = {"allreduce": "ALL_REDUCE", "allgather": "ALL_GATHER", "allgatherv": "ALL_GATHER",
              "reducescatter": "REDUCE_SCATTER", "reducescatterv": "REDUCE_SCATTER",
              "alltoall": "ALL_TO_ALL", "alltoallv": "ALL_TO_ALL", "alltoallvc": "ALL_TO_ALL",
              "broadcast": "BROADCAST", "send": "SEND", "receive": "RECV", "recv": "RECV"}
HCOM = re.compile(r"hcom_([A-Za-z]+)", re.IGNORECASE)
PROFILER_INFO = re.compile(r"profiler_info_(\d+)\.json$")


@dataclass
class Kernel:
    """One row of a kernel table."""

    rank: int
    stream: int | None
    name: str
    type: str
    core: str  # CORES' value, or the raw text when unknown
    core_text: str  # the Accelerator Core / Task Type as written
    start_ns: Decimal
    duration_ns: float
    block_dim: int | None
    ins: list | None
    in_types: list
    outs: list | None
    step: str | None
    where: str  # file:line, for messages


@dataclass
class Source:
    """One rank's profile: its kernel table and the communication files beside it."""

    csv_path: Path
    rank: int | None  # from profiler_info_{rank}.json; None: from the table's Device_id
    folder: Path  # where communication.json and the others are looked for
    comm: dict = field(default_factory=dict)  # op name -> (group, bytes moved)
    peers: dict = field(default_factory=dict)  # op name -> [(src, dst, bytes)]
    tasks: list | None = None  # HCCL tasks of the timeline JSON (task_links), read when first needed

    def task_links(self, k: "Kernel") -> list:
        """[(src, dst, bytes)] of the HCCL tasks (Memcpy, Notify_Record, Notify_Wait, ...) that ran
        within the op's measured span, from the timeline beside the table (torch_npu's
        ``trace_view.json``, msprof's ``msprof_*.json``): each task's ``src rank``, ``dst rank``
        and ``size(Byte)``, summed per link."""
        if self.tasks is None:
            self.tasks = _read_tasks(self.folder)
        start, end = k.start_ns, k.start_ns + Decimal(repr(k.duration_ns))
        links = {}
        for t0, t1, a, b, size in self.tasks:
            if start <= t0 and t1 <= end:
                links[a, b] = links.get((a, b), 0) + size
        return [(a, b, size) for (a, b), size in links.items()]


@dataclass
class ImportResult:
    doc: dict
    sources: list[str]
    variants: list[str]
    counts: dict
    unmapped: Unmapped
    time_deps: int

    def summary_lines(self, output) -> list[str]:
        c = self.counts
        kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(c["types"].items()))
        lines = [f"wrote {output}: {len(self.doc['nodes']):,} nodes ({kinds}) on {c['ranks']} rank(s) from "
                 f"{len(self.sources)} profile(s) ({'; '.join(sorted(set(self.variants)))})",
                 f"  {c['retimeable']:,} COMP with a die-model op and shape (cmemu run --retime re-times them); "
                 f"measured time of the COMP nodes {c['comp_ns'] / 1000:,.3f} us; {self.time_deps:,} cross-stream "
                 "dependencies from measured times"]
        lines += [f"  not mapped: {line}" for line in self.unmapped.lines()]
        return lines


def find_sources(root: Path) -> list[Source]:
    """Every rank's kernel table under ``root`` (a torch_npu ``*_ascend_pt`` folder, its
    ``ASCEND_PROFILER_OUTPUT``, a ``PROF_*`` or ``mindstudio_profiler_output`` folder, or a
    folder of many). A torch_npu folder's own msprof copy (its PROF_* inside) is not read twice."""
    if not root.exists():
        raise InputFileError(root, "no such folder")
    if not root.is_dir():
        raise InputFileError(root, "not a folder: give the profiler's output folder")
    sources = []
    torch_folders = []
    for path in sorted(root.rglob("kernel_details.csv")):
        folder = path.parent.parent if path.parent.name == "ASCEND_PROFILER_OUTPUT" else path.parent
        rank = None
        for info in sorted(folder.glob("profiler_info_*.json")):
            m = PROFILER_INFO.search(info.name)
            if m:
                rank = int(m.group(1))
        torch_folders.append(folder)
        sources.append(Source(path, rank, path.parent))
    for path in sorted(root.rglob("op_summary_*.csv")):
        if any(folder in path.parents for folder in torch_folders):
            continue
        sources.append(Source(path, None, path.parent))
    if not sources:
        raise InputFileError(root, "no kernel_details.csv (torch_npu) or op_summary_*.csv (msprof) under this folder")
    return sources


def _column_map(header: list[str], path: Path) -> tuple[dict, str]:
    """Canonical column -> (index, header name); and the variant's label."""
    clean = [h.strip().lstrip("\ufeff") for h in header]
    where = {}
    for key, names in COLUMNS.items():
        for name in names:
            if name in clean:
                where[key] = (clean.index(name), name)
                break
    for key in REQUIRED:
        if key not in where:
            names = " or ".join(repr(n) for n in COLUMNS[key])
            raise InputFileError(path, f"no {names} column: not a kernel_details.csv or op_summary_*.csv header "
                                 "this cmemu knows", 1)
    family = "kernel_details" if where["name"][1] == "Name" else "op_summary"
    label = f"{family} with '{where['start'][1]}'"
    label += ", Stream ID" if "stream" in where else ", no Stream ID"
    return where, label


def _cell(row, where, key):
    if key not in where:
        return None
    text = row[where[key][0]].strip()
    return None if text in ABSENT else text


def _number(row, where, key, path, line, integer=False):
    text = _cell(row, where, key)
    if text is None:
        return None
    try:
        value = Decimal(text)
        if not value.is_finite():
            raise InvalidOperation
        if integer:
            if value != value.to_integral_value() or value < 0:
                raise InvalidOperation
            return int(value)
        return value
    except InvalidOperation:
        what = "an integer >= 0" if integer else "a number"
        raise InputFileError(path, f"{where[key][1]!r}: expected {what}, got {text!r}", line,
                           where[key][0] + 1) from None


def read_kernels(src: Source) -> tuple[list[Kernel], str]:
    """The rows of one kernel table, as Kernels; and the header variant's label."""
    path = src.csv_path
    try:
        f = path.open(encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise InputFileError(path, "no such file") from None
    kernels = []
    with f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if header is None:
                raise InputFileError(path, "empty file: no header", 1)
            where, label = _column_map(header, path)
            for row in reader:
                line = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    raise InputFileError(path, f"{len(row)} fields, the header has {len(header)}", line)
                kernels.append(_kernel(row, where, src, path, line))
        except csv.Error as exc:
            raise InputFileError(path, f"malformed CSV: {exc}", reader.line_num) from None
        except UnicodeDecodeError:
            raise InputFileError(path, "not UTF-8 text", reader.line_num + 1) from None
    return kernels, label


def _kernel(row, where, src, path, line) -> Kernel:
    start = _number(row, where, "start", path, line)
    duration = _number(row, where, "duration", path, line)
    for key, value in (("start", start), ("duration", duration)):
        if value is None or value < 0:
            raise InputFileError(path, f"{where[key][1]!r}: expected a time >= 0, got "
                               f"{row[where[key][0]].strip()!r}", line, where[key][0] + 1)
    start_ns = start * TIME_SCALE[where["start"][1]]
    duration_ns = float(duration * TIME_SCALE[where["duration"][1]])
    rank = src.rank
    if rank is None:
        rank = _number(row, where, "device", path, line, integer=True)
        rank = 0 if rank is None else rank
    name = _cell(row, where, "name") or f"row_{line}"
    op_type = _cell(row, where, "type") or ""
    core_text = (_cell(row, where, "core") or "").upper().replace(" ", "_")
    core = CORES.get(core_text, core_text)
    if HCOM.match(name) or HCOM.match(op_type):
        core = "comm"
    return Kernel(rank=rank, stream=_number(row, where, "stream", path, line, integer=True), name=name, type=op_type,
                  core=core, core_text=core_text, start_ns=start_ns, duration_ns=duration_ns,
                  block_dim=_number(row, where, "block_dim", path, line, integer=True),
                  ins=parse_shapes(_cell(row, where, "input_shapes")),
                  in_types=parse_dtypes(_cell(row, where, "input_types")),
                  outs=parse_shapes(_cell(row, where, "output_shapes")), step=_cell(row, where, "step"),
                  where=f"{path.name}:{line}")


def _read_comm(src: Source) -> None:
    """communication.json (op@group -> transport volume) and communication_matrix.json (op ->
    links) beside the table, or in the msprof folder's ``analyze``; absent files give nothing."""
    for folder in (src.folder, src.folder.parent / "analyze"):
        path = folder / "communication.json"
        if path.is_file():
            for key, info in _op_entries(read_json(path), path):
                name, _, group = key.partition("@")
                bw = info.get("Communication Bandwidth Info", {})
                mb = sum(_mb(v.get("Transit Size(MB)", 0), path, key) for v in bw.values() if isinstance(v, dict))
                src.comm[name] = (group or None, int(round(mb * MIB)))
            break
    for folder in (src.folder, src.folder.parent / "analyze"):
        path = folder / "communication_matrix.json"
        if path.is_file():
            for key, links in _op_entries(read_json(path), path, matrix=True):
                for link, info in links.items():
                    if not isinstance(info, dict) or "-" not in link:
                        continue
                    a, _, b = link.partition("-")
                    if not (a.isdigit() and b.isdigit()) or a == b:
                        continue
                    op = info.get("op_name") or key.partition("@")[0]
                    src.peers.setdefault(op.partition("@")[0], []).append(
                        (int(a), int(b), int(round(_mb(info.get("Transit Size(MB)", 0), path, key) * MIB))))
            break


def _read_tasks(folder: Path) -> list:
    """(start ns, end ns, src rank, dst rank, bytes) of every HCCL task event of the Chrome trace
    JSON beside a table (events whose args give ``src rank``, ``dst rank``; ``ts``/``dur`` in us)."""
    paths = [folder / "trace_view.json"] + sorted(folder.glob("msprof_*.json"))
    tasks = []
    for path in paths:
        if not path.is_file():
            continue
        doc = read_json(path)
        events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
        if not isinstance(events, list):
            raise InputFileError(path, "not a Chrome trace: no list of events")
        for e in events:
            args = e.get("args") if isinstance(e, dict) else None
            if not isinstance(args, dict) or "src rank" not in args or "dst rank" not in args:
                continue
            try:
                t0 = Decimal(str(e["ts"]).strip()) * 1000
                t1 = t0 + Decimal(str(e.get("dur", 0)).strip()) * 1000
                a, b = int(args["src rank"]), int(args["dst rank"])
                size = int(args.get("size(Byte)", 0) or 0)
            except (KeyError, ValueError, InvalidOperation, TypeError):
                raise InputFileError(path, f"an HCCL task event without a number in ts, dur, src rank, dst rank or "
                                     f"size(Byte): {e.get('name', '?')!r} at ts {e.get('ts')!r}") from None
            if a != b and a >= 0 and b >= 0:
                tasks.append((t0, t1, a, b, max(0, size)))
    return tasks


def _mb(value, path, key) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise InputFileError(path, f"{key}: 'Transit Size(MB)' must be a number >= 0, got {value!r}")
    return float(value)


def _op_entries(doc, path, matrix=False):
    """(key, value) of every op entry, at any depth (step -> collective/p2p -> op@group)."""
    if not isinstance(doc, dict):
        raise InputFileError(path, f"the top level must be an object, got {type(doc).__name__}")
    stack = [doc]
    while stack:
        d = stack.pop()
        for key, value in d.items():
            if not isinstance(value, dict):
                continue
            is_op = ("@" in key) if matrix else ("Communication Bandwidth Info" in value
                                                   or "Communication Time Info" in value)
            if is_op:
                yield key, value
            else:
                stack.append(value)


def _groups_of(root: Path) -> dict:
    """parallel_group_info of every profiler_metadata.json: group id -> (its name, global ranks)."""
    groups = {}
    for path in sorted(root.rglob("profiler_metadata.json")):
        info = read_json(path)
        pgi = info.get("parallel_group_info", {}) if isinstance(info, dict) else {}
        for gid, g in (pgi.items() if isinstance(pgi, dict) else ()):
            ranks = g.get("global_ranks") if isinstance(g, dict) else None
            if isinstance(ranks, list) and all(isinstance(r, int) and r >= 0 for r in ranks) and len(ranks) >= 2:
                name = g.get("group_name")
                groups[gid] = (name if isinstance(name, str) and name else None, list(ranks))
    return groups


def import_ascend(root, num_ranks: int, system: str | None = None, step: str | None = None,
                  deps: str = "time", die_cores: tuple[int, int] | None = None) -> ImportResult:
    """Build the trace document of the profiles under ``root`` (see the module docstring).
    ``num_ranks``: the system's dies (a rank is a die); ``die_cores``: its (AIC, AIV) per die,
    so that ``cmemu.cores`` is given the kernel's Block Dim where the die has that many."""
    if deps not in ("time", "stream"):
        raise ValueError(f"deps must be 'time' or 'stream', got {deps!r}")
    root = Path(root)
    sources = find_sources(root)
    kernels, variants, by_rank_src = [], [], {}
    for src in sources:
        rows, label = read_kernels(src)
        variants.append(label)
        _read_comm(src)
        for k in rows:
            other = by_rank_src.setdefault(k.rank, src)
            if other.folder != src.folder:  # one folder's tables (msprof's slices) are one profile
                raise InputFileError(src.csv_path, f"rank {k.rank} is in {other.csv_path} too: each rank's "
                                   "profile must be given once")
        kernels += rows
    if step is not None:
        kernels = [k for k in kernels if k.step == step]
        if not kernels:
            raise InputFileError(root, f"no kernel of step {step!r} (the 'Step Id' column)")
    if not kernels:
        raise InputFileError(root, "the kernel tables hold no rows")
    for k in kernels:
        if k.rank >= num_ranks:
            raise InputFileError(k.where, f"rank {k.rank} is outside the system ({num_ranks} dies): choose a larger "
                               "--system")
    group_ranks = _groups_of(root)
    builder = _Builder(num_ranks, die_cores, group_ranks, by_rank_src)
    doc = builder.build(kernels, deps)
    doc["system"] = system
    if system is None:
        del doc["system"]
    doc["cmemu.import"] = {"from": "ascend", "files": [str(s.csv_path.relative_to(root)) for s in sources],
                           "variants": sorted(set(variants)), "step": step, "deps": deps}
    return ImportResult(doc, [str(s.csv_path) for s in sources], variants, builder.counts, builder.unmapped,
                        builder.time_deps)


class _Builder:
    """Kernels -> nodes, groups, messages and dependencies."""

    def __init__(self, num_ranks, die_cores, group_ranks, src_of):
        self.num_ranks, self.die_cores, self.group_ranks, self.src_of = num_ranks, die_cores, group_ranks, src_of
        self.unmapped = Unmapped()
        self.counts = {"types": {}, "retimeable": 0, "comp_ns": 0.0, "ranks": 0}
        self.time_deps = 0

    def build(self, kernels, deps) -> dict:
        t0 = min(k.start_ns for k in kernels)
        by_rank = {}
        for k in kernels:
            by_rank.setdefault(k.rank, []).append(k)
        self.counts["ranks"] = len(by_rank)
        nodes, colls, msgs = [], [], []
        for rank in sorted(by_rank):
            rows = sorted(by_rank[rank], key=lambda k: (k.start_ns, k.where))
            streams = [k.stream for k in rows if k.stream is not None]
            comm_stream = max(streams, default=0) + 1  # HCCL rows without a Stream ID (N/A)
            for k in rows:
                stream = k.stream if k.stream is not None else (comm_stream if k.core == "comm" else 0)
                node = {"id": len(nodes), "name": k.name, "type": "COMP", "rank": rank, "stream": stream}
                node["x-start_ns"] = float(k.start_ns - t0)
                node["x-end_ns"] = node["x-start_ns"] + k.duration_ns
                if k.core == "comm":
                    self._comm(k, node, colls, msgs)
                if node["type"] == "COMP":
                    node["attrs"] = self._comp(k)
                nodes.append(node)
        groups = self._collectives(colls)
        self._messages(msgs)
        if deps == "time":
            self._time_deps(nodes)
        for node in nodes:
            del node["x-start_ns"], node["x-end_ns"]
            self.counts["types"][node["type"]] = self.counts["types"].get(node["type"], 0) + 1
        doc = {"schema": "cmemu.trace", "version": 1, "time_unit": "ns", "system": None,
               "description": f"imported from Ascend profiler output ({len(by_rank)} rank(s))"}
        if groups:
            doc["groups"] = groups
        doc["nodes"] = nodes
        return doc

    def _comp(self, k: Kernel) -> dict:
        attrs = {"cmemu.duration_ns": k.duration_ns}
        self.counts["comp_ns"] += k.duration_ns
        unit = k.core if k.core in ("aic", "aiv") else None
        if k.core not in ("aic", "aiv", "comm"):
            self.unmapped.add(f"kernels on {k.core_text or 'an unnamed core'} (not AI Core / AI Vector Core): kept "
                              "at their measured time, holding no cores", k.name)
        op, why = die_op(k.type, k.ins, k.in_types, k.outs) if k.core != "comm" else (None, "")
        if op is not None:
            attrs.update(op)
            self.counts["retimeable"] += 1
            unit = None  # the op's own unit
        elif why and k.core in ("aic", "aiv"):
            self.unmapped.add(f"{k.type or 'untyped'} kernels kept at their measured time ({why})", k.name)
        if unit is not None:
            attrs["cmemu.unit"] = unit
        cores = self._cores(k, op)
        if cores is not None:
            attrs["cmemu.cores"] = cores
        if k.type:
            attrs["x-ascend.type"] = k.type
        return attrs

    def _cores(self, k: Kernel, op) -> int | None:
        if self.die_cores is None or not k.block_dim or k.core not in ("aic", "aiv"):
            return None
        from cmemu.vocab import CLUSTER_OPS, COMP_OPS

        unit = COMP_OPS[op["cmemu.op"]][0] if op else k.core
        aic, aiv = self.die_cores
        limit = aic if unit == "aic" else aiv
        if op and op["cmemu.op"] in CLUSTER_OPS:
            limit = min(aic, aiv // 2)
        if k.block_dim > limit:
            self.unmapped.add(f"kernels with a Block Dim above the die's {unit.upper()} cores: given all of them",
                              k.name)
            return None
        return k.block_dim

    def _comm(self, k: Kernel, node: dict, colls: list, msgs: list) -> None:
        m = HCOM.match(k.name) or HCOM.match(k.type)
        kind = HCCL_KINDS.get(m.group(1).lower()) if m else None
        if kind is None:
            self.unmapped.add(f"communication ops {m.group(1) if m else k.name!r} cmemu has no collective for: "
                              "kept as a fixed-time COMP on their stream", k.name)
            return
        src = self.src_of.get(k.rank)
        group, moved = src.comm.get(k.name, (None, None)) if src else (None, None)
        if kind in ("SEND", "RECV"):
            links = (src.peers.get(k.name) or src.task_links(k)) if src else []
            msgs.append((node, kind, k, group, links))
            node["type"] = "COMM_SEND" if kind == "SEND" else "COMM_RECV"
            return
        node["type"] = "COMM_COLL"
        node["attrs"] = {"comm_type": kind}
        colls.append((node, k, group, moved))

    def _collectives(self, colls) -> dict:
        """Group the COMM_COLL nodes, check the members agree, and give each its comm_size."""
        by_group = {}
        for node, k, group, moved in colls:
            by_group.setdefault(group, []).append((node, k, moved))
        groups = {}
        for gid, members in by_group.items():
            given, ranks = self.group_ranks.get(gid, (None, None)) if gid else (None, None)
            present = sorted({node["rank"] for node, _, _ in members})
            if ranks is None:  # the ranks whose profile has an op of the group (communication.json too)
                ranks = sorted(set(present) | {r for r, src in self.src_of.items()
                                               if gid and any(g == gid for g, _ in src.comm.values())})
            elif not set(present) <= set(ranks):
                raise InputFileError(members[0][1].where, f"group {gid}: ranks {present} hold its ops, "
                                   f"profiler_metadata.json gives it ranks {ranks}")
            name = _group_name(given or gid, len(groups))
            if name in groups:
                name = f"{name}_{len(groups)}"
            if len(ranks) < 2 or not set(ranks) <= set(self.src_of):
                for node, k, _ in members:
                    self._fixed(node, k, f"collectives of a group of which fewer than two ranks, or not all of its "
                                f"ranks ({len(ranks)}), were profiled")
                continue
            per_rank = {r: [] for r in ranks}
            for member in members:
                per_rank[member[0]["rank"]].append(member)
            counts = {r: len(v) for r, v in per_rank.items()}
            if len(set(counts.values())) > 1:
                raise InputFileError(members[0][1].where, f"group {gid or name}: the ranks hold different numbers of "
                                   f"its collectives ({counts}): their profiles do not cover the same steps (--step)")
            groups[name] = list(ranks)
            for i in range(counts[ranks[0]]):
                same = [per_rank[r][i] for r in ranks]
                types = {node["attrs"]["comm_type"] for node, _, _ in same}
                if len(types) > 1:
                    raise InputFileError(same[0][1].where, f"group {gid or name}: its collective {i + 1} is "
                                       f"{' on some ranks, '.join(sorted(types))} on others")
                sizes = [_coll_size(node["attrs"]["comm_type"], k, moved, len(ranks)) for node, k, moved in same]
                if any(s is None for s in sizes):
                    for node, k, _ in same:
                        self._fixed(node, k, "collectives with neither input shapes nor a communication.json "
                                    "volume: no size")
                    continue
                for node, _, _ in same:
                    node["attrs"].update({"comm_size": max(sizes), "cmemu.group": name})
        return groups

    def _messages(self, msgs) -> None:
        """Peers from communication_matrix.json; the k-th send a -> b with the k-th receive."""
        sends, recvs = {}, {}
        for node, kind, k, group, links in msgs:
            ranks = self.group_ranks.get(group, (None, None))[1] if group else None
            peer = size = None
            for a, b in ((x, y) for x, y, _ in links):
                ga, gb = (ranks[a], ranks[b]) if ranks and a < len(ranks) and b < len(ranks) else (a, b)
                mine, other = (ga, gb) if kind == "SEND" else (gb, ga)
                if mine == node["rank"] and other < self.num_ranks:
                    peer = other
                    size = next(s for x, y, s in links if (x, y) == (a, b))
                    break
            if peer is None:
                self._fixed(node, k, f"{'sends' if kind == 'SEND' else 'receives'} without a peer in "
                            "communication_matrix.json")
                continue
            key = (node["rank"], peer) if kind == "SEND" else (peer, node["rank"])
            (sends if kind == "SEND" else recvs).setdefault(key, []).append((node, k, size))
        for key in set(sends) | set(recvs):
            s, r = sends.get(key, []), recvs.get(key, [])
            for i in range(max(len(s), len(r))):
                if i >= len(s) or i >= len(r):
                    node, k, _ = s[i] if i < len(s) else r[i]
                    self._fixed(node, k, "sends or receives whose other side was not profiled")
                    continue
                size = s[i][2]
                s[i][0]["attrs"] = {"comm_dst": key[1], "comm_size": size}
                r[i][0]["attrs"] = {"comm_src": key[0], "comm_size": size}

    def _fixed(self, node: dict, k: Kernel, why: str) -> None:
        """A communication op that cannot be mapped: a fixed-time COMP of its measured duration."""
        node["type"] = "COMP"
        node["attrs"] = {"cmemu.duration_ns": k.duration_ns}
        self.counts["comp_ns"] += k.duration_ns
        self.unmapped.add(f"{why}: kept as a fixed-time COMP", k.name)

    def _time_deps(self, nodes) -> None:
        """Each node waits for the last node of every other stream of its rank that had ended when
        it started (measured), unless an earlier node of its own stream already waits for it."""
        by_rank = {}
        for node in nodes:
            by_rank.setdefault(node["rank"], {}).setdefault(node["stream"], []).append(node)
        for streams in by_rank.values():
            if len(streams) < 2:
                continue
            # a stream's nodes run one after another; the running maximum keeps their ends in order
            ends = {s: list(accumulate((n["x-end_ns"] for n in lst), max)) for s, lst in streams.items()}
            for s, lst in streams.items():
                seen = {}  # other stream -> index of the last node already waited for
                for node in lst:
                    for other, other_ends in ends.items():
                        if other == s:
                            continue
                        i = bisect_right(other_ends, node["x-start_ns"]) - 1
                        while i >= 0 and streams[other][i]["id"] > node["id"]:
                            i -= 1  # zero-length nodes that start together: the earlier row first, no cycle
                        if i >= 0 and seen.get(other, -1) < i:
                            seen[other] = i
                            node.setdefault("ctrl_deps", []).append(streams[other][i]["id"])
                            self.time_deps += 1


def _group_name(gid: str | None, index: int) -> str:
    if not gid:
        return "world"
    text = re.sub(r"[^A-Za-z0-9_.-]", "_", gid)
    return text if len(text) <= 64 else f"group{index}"


def _coll_size(kind: str, k: Kernel, moved: int | None, members: int) -> int | None:
    """comm_size of one member's collective: from its input tensor when the row gives it, else
    from the bytes communication.json says it moved, by the volume of a ring (all-reduce
    2(n-1)/n of the buffer, reduce-scatter (n-1)/n, all-gather and all-to-all n-1 parts, broadcast
    one buffer; assumed: HCCL's algorithms move about that much)."""
    if k.ins and k.ins[0] and k.in_types:
        size = tensor_bytes(k.ins[0], k.in_types[0])
        if size:
            return max(1, size // members) if kind == "ALL_TO_ALL" else size
    if moved is None:
        return None
    n = members
    if kind == "ALL_REDUCE":
        return round(moved * n / (2 * (n - 1)))
    if kind == "REDUCE_SCATTER":
        return round(moved * n / (n - 1))
    if kind in ("ALL_GATHER", "ALL_TO_ALL"):
        return round(moved / (n - 1))
    return moved
