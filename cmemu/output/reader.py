"""Reading a timeline: ``cmemu.open_timeline(path)``, for layout versions 1 to 5.

Tables come back as pandas DataFrames when pandas is installed, otherwise as numpy structured
arrays with the same columns. Enum columns (op type, link kind, pipe) come back as their names.
A file of a version this reader does not know is refused with a message naming the versions it
reads; figures a v1 file lacks are derived from what it has (``dies()``), or are empty (``tasks()``).
"""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from cmemu.errors import CmemuError
from cmemu.output.schema import READABLE_VERSIONS, TASK_FIELDS, TIMELINE_FORMAT
from cmemu.output.summary import die_summary, hbm_capacity, hbm_figures
from cmemu.results.overlap import busy_union_ps
from cmemu.topology import LINK_KIND_NAMES
from cmemu.vocab import NODE_TYPES, PACKET_TYPE_NAMES, PIPE_NAMES

class TimelineError(CmemuError):
    """A file that is not a cmemu timeline, or one of a version this reader does not know."""


# The layout version that added each group (docs/timeline-format.md, Versions). A group newer
# than the file is missing with a message saying so; an optional one the run did not record, too.
ADDED_IN = {"dies": 2, "tasks": 2, "links/binned": 2, "dies/hbm_binned": 3, "dies/hbm_stack_binned": 4,
            "moe_pairs": 4, "packets": 4}
OPTIONAL = {"packets": "the run was written without --detail packets (cmemu run TRACE --detail packets keeps "
                       "every packet on every link; for small runs)",
            "links/binned": "the run binned no counters (cmemu run --link-bin-ns 0)",
            "dies/hbm_binned": "the run binned no counters (cmemu run --link-bin-ns 0)",
            "dies/hbm_stack_binned": "the run binned no counters (cmemu run --link-bin-ns 0)"}


# The datasets every reader needs, by group (docs/timeline-format.md), all of one length per group;
# groups of a later version, or optional ones, are checked when the file has them.
LAYOUT = {
    "ops": ("node_id", "rank", "stream", "type", "name", "start_ps", "end_ps", "bytes"),
    "messages": ("send_op", "recv_op", "bytes", "packets"),
    "links": ("src_vertex", "dst_vertex", "kind", "rate_byte_per_s", "latency_ps", "bytes", "busy_ps"),
    "dies": ("node", "npu", "die_in_npu", "busy_ps", "any_busy_ps", "exposed_comm_ps", "bytes_sent",
             "bytes_received", "hbm_read_bytes", "hbm_write_bytes"),
    "tasks": tuple(name for name, _ in TASK_FIELDS),
    "links/binned": ("link", "bin", "bytes", "busy_ps"),
    "dies/hbm_binned": ("die", "bin", "bytes"),
    "dies/hbm_stack_binned": ("die", "stack", "bin", "bytes"),
    "moe_pairs": ("dispatch_op", "combine_op"),
    "packets": ("start_ps", "end_ps", "link", "msg", "op", "seq", "wire_bytes", "type"),
}
REQUIRED_GROUPS = {1: ("ops", "messages", "links"), 2: ("ops", "messages", "links", "dies", "tasks")}
# The spec fields the reader uses (spec_json), each a whole number within what a spec may hold.
SPEC_COUNTS = (("nodes", 4096), ("npus_per_node", 256), ("dies_per_npu", 2), ("cpus_per_node", 256),
               ("ub.sub_planes", 64), ("ub.l2_chips_per_sub_plane", 1024))
# A time bin's number is an int32 in the file.
MAX_BIN = 2**31 - 1


def open_timeline(path) -> "Timeline":
    """Open an HDF5 timeline written by ``cmemu run`` (any version in READABLE_VERSIONS)."""
    return Timeline(path)


def _table(columns: dict, as_numpy: bool = False):
    """A DataFrame (pandas) or a numpy structured array from equal-length columns."""
    if not as_numpy:
        try:
            import pandas as pd
        except ImportError:
            pass
        else:
            return pd.DataFrame(columns)
    n = len(next(iter(columns.values()))) if columns else 0
    dtype = []
    for name, col in columns.items():
        col = np.asarray(col)
        dtype.append((name, col.dtype if col.dtype != object else object))
    out = np.empty(n, dtype=dtype)
    for name, col in columns.items():
        out[name] = col
    return out


def _names(codes, names) -> np.ndarray:
    """Enum codes to their names (a numpy array of str)."""
    return np.asarray(names, dtype=object)[np.asarray(codes, dtype=np.int64)] if len(codes) else np.zeros(0, dtype=object)


class Timeline:
    """One timeline file. Use as a context manager, or call ``close()``.

    ``attrs`` holds the root attributes (plain Python values), ``spec`` the resolved hardware
    spec (a dict, every value with its source), ``version`` the layout version.
    """

    def __init__(self, path, as_numpy: bool = False):
        self.path = Path(path)
        self.as_numpy = as_numpy
        try:
            self._f = h5py.File(self.path, "r")
        except FileNotFoundError:
            raise TimelineError(f"{self.path}: no such file") from None
        except OSError as exc:
            raise TimelineError(f"{self.path}: not an HDF5 file ({exc})") from None
        fmt = self._f.attrs.get("format")
        if isinstance(fmt, bytes):
            fmt = fmt.decode()
        if fmt != TIMELINE_FORMAT:
            self._f.close()
            raise TimelineError(f"{self.path}: not a cmemu timeline (root attribute format={fmt!r}, "
                                f"expected {TIMELINE_FORMAT!r})")
        version = int(self._f.attrs.get("version", -1))
        if version not in READABLE_VERSIONS:
            self._f.close()
            raise TimelineError(
                f"{self.path}: timeline layout version {version} is not one this cmemu reads "
                f"(it reads versions {', '.join(map(str, READABLE_VERSIONS))}); "
                "a newer cmemu wrote it: upgrade cmemu to read it"
            )
        self.version = version
        try:
            self._check_layout()
        except BaseException:
            self._f.close()
            raise

    def _damaged(self, what: str) -> TimelineError:
        return TimelineError(f"{self.path}: a damaged timeline: {what}")

    def _check_layout(self) -> None:
        """The groups, datasets and attributes the readers use, each there, of the right shape and
        kind (HDF5 errors of a damaged file become TimelineError); the spec the file carries."""
        try:
            self.attrs = {k: _plain(v) for k, v in self._f.attrs.items()}
            groups = REQUIRED_GROUPS[1 if self.version < 2 else 2] + tuple(
                g for g in ("links/binned", "dies/hbm_binned", "dies/hbm_stack_binned", "moe_pairs", "packets")
                if g in self._f)
            self._rows = {}
            for g in groups:
                if g not in self._f or not isinstance(self._f[g], h5py.Group):
                    raise self._damaged(f"no group /{g}")
                n = None
                for name in LAYOUT[g]:
                    ds = self._f[g].get(name)
                    ndim = 2 if (g, name) == ("dies", "busy_ps") else 1
                    if not isinstance(ds, h5py.Dataset) or len(ds.shape) != ndim:
                        raise self._damaged(f"/{g}/{name} is missing or not a {ndim}-D dataset")
                    if name != "name" and ds.dtype.kind not in "iu":
                        raise self._damaged(f"/{g}/{name} holds {ds.dtype}, not integers")
                    if n is not None and ds.shape[0] != n:
                        raise self._damaged(f"/{g}/{name} has {ds.shape[0]:,} rows, the other columns of /{g} "
                                            f"{n:,}")
                    n = ds.shape[0]
                self._rows[g] = n
            if self.version >= 2:
                for where, key in (("tasks", "status"), ("dies/busy_ps", "columns")):
                    if key not in self._f[where].attrs:
                        raise self._damaged(f"/{where} has no attribute {key}")
            if "dies/hbm_stack_binned" in self._f:
                stacks = self._f["dies/hbm_stack_binned"].attrs.get("stacks")
                if stacks is None or not 0 < int(stacks) <= 127:
                    raise self._damaged("/dies/hbm_stack_binned has no stacks attribute (1 to 127)")
            for g in ("links/binned", "dies/hbm_binned"):
                if g in self._f:
                    bin_ps = self._f[g].attrs.get("bin_ps")
                    if bin_ps is None or not 0 < int(bin_ps) <= 2**62:
                        raise self._damaged(f"/{g} has no bin width (its attribute bin_ps, ps > 0)")
            # Enum names as this file stores them (later cmemu versions may append members).
            self.op_types = _enum_names(self._f["ops/type"], NODE_TYPES)
            self.link_kinds = _enum_names(self._f["links/kind"], LINK_KIND_NAMES)
            self.pipes = _enum_names(self._f["tasks/pipe"], PIPE_NAMES) if "tasks/pipe" in self._f else PIPE_NAMES
        except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
            raise self._damaged(f"HDF5 cannot read its layout ({_one_line(exc)})") from None
        try:
            self.spec = json.loads(self.attrs["spec_json"])
        except KeyError:
            raise self._damaged("no spec_json attribute") from None
        except (TypeError, ValueError) as exc:
            raise self._damaged(f"its spec_json is not JSON ({_one_line(exc)})") from None
        for key, most in SPEC_COUNTS:
            v = self.spec
            for part in key.split("."):
                v = v.get(part) if isinstance(v, dict) else None
            if type(v) is not int or not 1 <= v <= most:
                raise self._damaged(f"its spec_json has no {key} (a whole number from 1 to {most})")
        if not isinstance(self.spec.get("die"), dict):
            raise self._damaged("its spec_json has no die")
        end = self.attrs.get("sim_end_ps")
        if isinstance(end, bool) or not isinstance(end, int) or not 0 <= end <= 2**62:
            raise self._damaged("no sim_end_ps attribute (the run's end, ps from 0 to 2**62)")
        self.sim_end_ps = int(end)
        if self.version >= 2 and self._rows["dies"] != self.dies_count:
            raise self._damaged(f"/dies has {self._rows['dies']:,} rows, its spec {self.dies_count:,} dies")

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<Timeline {self.path} v{self.version} {self.attrs.get('preset')} {self.sim_end_ps / 1e6:,.3f} us>"

    # -- raw columns -----------------------------------------------------------------------
    def require(self, group: str):
        """The HDF5 group, or a TimelineError saying why this file lacks it."""
        if group in self._f:
            return self._f[group]
        since = ADDED_IN.get(group)
        if since is not None and self.version < since:
            raise TimelineError(f"{self.path}: no /{group}: this file has layout version {self.version}, "
                                f"/{group} came with version {since}; run the trace again with this cmemu "
                                "to get it")
        why = OPTIONAL.get(group, "not written by the cmemu that made this file")
        raise TimelineError(f"{self.path}: no /{group}: {why}")

    def columns(self, group: str) -> dict:
        """Every dataset of a group as numpy arrays (enum codes as integers, names as str); the
        rows and codes that point elsewhere checked to point inside the file (TimelineError)."""
        g = self.require(group)
        out = {}
        try:
            for name, ds in g.items():
                if not isinstance(ds, h5py.Dataset):
                    continue
                if h5py.check_string_dtype(ds.dtype) is not None:
                    out[name] = ds.asstr()[()].astype(object) if ds.shape[0] else np.zeros(0, dtype=object)
                else:
                    out[name] = ds[()]
        except (OSError, KeyError, ValueError, TypeError, RuntimeError, UnicodeDecodeError) as exc:
            raise self._damaged(f"HDF5 cannot read /{group} ({_one_line(exc)})") from None
        self._check_rows(group, out)
        return out

    def _check_rows(self, group: str, c: dict) -> None:
        """What a group's columns point at, inside the file: ops, messages, links, dies, enum
        codes, time bins (before the run's end)."""
        rows = self._rows
        n_ops, n_links, dies = rows.get("ops", 0), rows.get("links", 0), self.dies_count
        last_bin = {g: self.sim_end_ps // int(self._f[g].attrs["bin_ps"]) for g in ("links/binned", "dies/hbm_binned")
                    if g in self._f}
        if "dies/hbm_stack_binned" in self._f and "dies/hbm_binned" in last_bin:
            last_bin["dies/hbm_stack_binned"] = last_bin["dies/hbm_binned"]
        stacks = int(self._f["dies/hbm_stack_binned"].attrs.get("stacks", 0)) if group == "dies/hbm_stack_binned" else 0
        bounds = {
            "ops": (("rank", 0, dies), ("type", 0, len(self.op_types)), ("start_ps", 0, 2**62 + 1),
                    ("end_ps", 0, 2**62 + 1)),
            "messages": (("send_op", 0, n_ops), ("recv_op", 0, n_ops)),
            "links": (("src_vertex", 0, len(self.vertex_names())), ("dst_vertex", 0, len(self.vertex_names())),
                      ("kind", 0, len(self.link_kinds))),
            "tasks": (("die", 0, dies), ("pipe", 0, len(self.pipes)), ("op", -1, n_ops), ("start_ps", 0, 2**62 + 1),
                      ("end_ps", 0, 2**62 + 1)),
            "links/binned": (("link", 0, n_links), ("bin", 0, last_bin.get(group, 0) + 1)),
            "dies/hbm_binned": (("die", 0, dies), ("bin", 0, last_bin.get(group, 0) + 1)),
            "dies/hbm_stack_binned": (("die", 0, dies), ("stack", 0, stacks), ("bin", 0, last_bin.get(group, 0) + 1)),
            "moe_pairs": (("dispatch_op", 0, n_ops), ("combine_op", 0, n_ops)),
            "packets": (("link", 0, n_links), ("op", 0, n_ops), ("msg", -1, rows.get("messages", 0)),
                        ("start_ps", 0, 2**62 + 1), ("end_ps", 0, 2**62 + 1)),
        }.get(group, ())
        for name, lo, hi in bounds:
            col = c.get(name)
            if col is not None and col.size and (int(col.min()) < lo or int(col.max()) >= hi):
                raise self._damaged(f"/{group}/{name} holds {int(col.min() if col.min() < lo else col.max()):,}, "
                                    f"outside {lo:,}..{hi - 1:,}")
        if group in ("ops", "tasks", "packets") and c["end_ps"].size and np.any(c["end_ps"] < c["start_ps"]):
            raise self._damaged(f"/{group} has a row that ends before it starts")

    @property
    def dies_count(self) -> int:
        s = self.spec
        return int(s["nodes"]) * int(s["npus_per_node"]) * int(s["dies_per_npu"])

    def has_tasks(self) -> bool:
        return self.version >= 2 and self._f["tasks/die"].shape[0] > 0

    def tasks_status(self) -> str:
        if self.version < 2:
            return "absent: layout version 1 has no /tasks"
        return _plain(self._f["tasks"].attrs["status"])

    def has_link_bins(self) -> bool:
        return "links/binned" in self._f

    # -- tables ----------------------------------------------------------------------------
    def ops(self):
        """One row per op: node_id, rank, stream, type (name), name, start_ps, end_ps, dur_ps, bytes."""
        c = self.columns("ops")
        return _table({
            "node_id": c["node_id"], "rank": c["rank"], "stream": c["stream"],
            "type": _names(c["type"], self.op_types), "name": c["name"],
            "start_ps": c["start_ps"], "end_ps": c["end_ps"], "dur_ps": c["end_ps"] - c["start_ps"],
            "bytes": c["bytes"],
        }, self.as_numpy)

    def messages(self):
        """One row per message: send_op, recv_op (rows of ops()), src_rank, dst_rank, bytes, packets,
        send_start_ps, recv_end_ps (when the whole message had arrived, or the receive began)."""
        c = self.columns("messages")
        o = self.columns("ops")
        rank, start, end = o["rank"], o["start_ps"], o["end_ps"]
        s, r = c["send_op"], c["recv_op"]
        return _table({
            "send_op": s, "recv_op": r, "src_rank": rank[s], "dst_rank": rank[r],
            "bytes": c["bytes"], "packets": c["packets"],
            "send_start_ps": start[s], "recv_end_ps": end[r],
        }, self.as_numpy)

    def links(self):
        """One row per directed link: link, kind (name), src/dst vertex and their names, rate, latency,
        bytes and busy_ps over the run, utilisation (busy_ps / sim_end_ps, a fraction)."""
        c = self.columns("links")
        names = self.vertex_names()
        busy = c["busy_ps"]
        util = busy / self.sim_end_ps if self.sim_end_ps > 0 else np.zeros(busy.shape)
        return _table({
            "link": np.arange(busy.size, dtype=np.int32), "kind": _names(c["kind"], self.link_kinds),
            "src_vertex": c["src_vertex"], "dst_vertex": c["dst_vertex"],
            "src": names[c["src_vertex"]], "dst": names[c["dst_vertex"]],
            "rate_byte_per_s": c["rate_byte_per_s"], "latency_ps": c["latency_ps"],
            "bytes": c["bytes"], "busy_ps": busy, "utilisation": util,
        }, self.as_numpy)

    def link_bins(self):
        """Binned link counters (v2, when the run recorded them), or None: link, bin, start_ps,
        bytes, busy_ps per nonzero (link, bin) pair. The bin width is ``link_bin_ps``."""
        if not self.has_link_bins():
            return None
        c = self.columns("links/binned")
        return _table({"link": c["link"], "bin": c["bin"], "start_ps": c["bin"].astype(np.int64) * self.link_bin_ps,
                       "bytes": c["bytes"], "busy_ps": c["busy_ps"]}, self.as_numpy)

    def has_hbm_bins(self) -> bool:
        return "dies/hbm_binned" in self._f

    def hbm_bins(self):
        """HBM bytes per (die, time bin) (v2, when the run recorded them), or None: die, bin,
        start_ps, bytes, gbyte_per_s (bytes over the bin). The bin width is ``hbm_bin_ps``."""
        if not self.has_hbm_bins():
            return None
        c = self.columns("dies/hbm_binned")
        bin_ps = self.hbm_bin_ps
        return _table({"die": c["die"], "bin": c["bin"], "start_ps": c["bin"].astype(np.int64) * bin_ps,
                       "bytes": c["bytes"], "gbyte_per_s": c["bytes"] / (bin_ps / 1e12) / 1e9}, self.as_numpy)

    def has_hbm_stack_bins(self) -> bool:
        return "dies/hbm_stack_binned" in self._f

    def hbm_stack_bins(self):
        """HBM bytes per (die, stack, time bin) (v4, when the run binned its counters), or None:
        die, stack, bin, start_ps, bytes, gbyte_per_s. Summed over the stacks they give
        ``hbm_bins()``. ``hbm_stacks`` is the number of stacks per die."""
        if not self.has_hbm_stack_bins():
            return None
        c = self.columns("dies/hbm_stack_binned")
        bin_ps = self.hbm_bin_ps
        return _table({"die": c["die"], "stack": c["stack"], "bin": c["bin"],
                       "start_ps": c["bin"].astype(np.int64) * bin_ps, "bytes": c["bytes"],
                       "gbyte_per_s": c["bytes"] / (bin_ps / 1e12) / 1e9}, self.as_numpy)

    @property
    def hbm_stacks(self) -> int:
        if self.has_hbm_stack_bins():
            return int(self._f["dies/hbm_stack_binned"].attrs["stacks"])
        return int(self.spec["die"].get("hbm_stacks", 1))

    def has_moe_pairs(self) -> bool:
        return "moe_pairs" in self._f

    def moe_pairs(self):
        """Each MoE exchange per rank (v4): dispatch_op, combine_op (rows of ops()), rank,
        dispatch_start_ps, combine_end_ps (the round trip as that rank sees it). A file older
        than v4 raises TimelineError saying so."""
        c = self.columns("moe_pairs")
        o = self.columns("ops")
        rank, start, end = o["rank"], o["start_ps"], o["end_ps"]
        d, k = c["dispatch_op"], c["combine_op"]
        return _table({"dispatch_op": d, "combine_op": k, "rank": rank[d], "dispatch_start_ps": start[d],
                       "combine_end_ps": end[k]}, self.as_numpy)

    def has_packets(self) -> bool:
        return "packets" in self._f

    def packets(self):
        """Every transmission of a packet on a link (v4, --detail packets), in the order they
        started: start_ps, end_ps (its tail left the sender), dur_ps, link (row of links()), msg
        (row of messages(), -1 for a collective's internal message), op (row of ops()), seq
        (packet of its message), wire_bytes, type (WRITE, READ_REQ, READ_RESP). A file written
        without --detail packets raises TimelineError saying so."""
        g = self.require("packets")
        c = self.columns("packets")
        types = _enum_names(g["type"], PACKET_TYPE_NAMES)
        return _table({"start_ps": c["start_ps"], "end_ps": c["end_ps"], "dur_ps": c["end_ps"] - c["start_ps"],
                       "link": c["link"], "msg": c["msg"], "op": c["op"], "seq": c["seq"],
                       "wire_bytes": c["wire_bytes"], "type": _names(c["type"], types)}, self.as_numpy)

    @property
    def hbm_bin_ps(self) -> int | None:
        return int(self._f["dies/hbm_binned"].attrs["bin_ps"]) if self.has_hbm_bins() else None

    @property
    def link_bin_ps(self) -> int | None:
        return int(self._f["links/binned"].attrs["bin_ps"]) if self.has_link_bins() else None

    def tasks(self):
        """One row per pipe/engine task: die, pipe (name), op, start_ps, end_ps, dur_ps, bytes.
        Empty for v1 files and for runs whose engine recorded none (see ``tasks_status()``)."""
        if self.version < 2:
            c = {name: np.zeros(0, dtype=dtype) for name, dtype in TASK_FIELDS}
        else:
            c = self.columns("tasks")
        return _table({
            "die": c["die"], "pipe": _names(c["pipe"], self.pipes), "op": c["op"],
            "start_ps": c["start_ps"], "end_ps": c["end_ps"], "dur_ps": c["end_ps"] - c["start_ps"],
            "bytes": c["bytes"],
        }, self.as_numpy)

    def dies_columns(self) -> dict:
        """The /dies columns as numpy arrays; derived from /ops and /messages for v1 files.
        ``busy_ps`` has a column per name in ``self.op_types``."""
        if self.version >= 2:
            c = self.columns("dies")
            columns = str(_plain(self._f["dies/busy_ps"].attrs["columns"])).split(",")
            if tuple(columns) != self.op_types:
                raise TimelineError(f"{self.path}: /dies/busy_ps columns {columns} differ from the op types "
                                    f"{list(self.op_types)} of /ops/type")
            return c
        return die_summary(self.columns("ops"), self.columns("messages"), self.spec, self.op_types)

    def dies(self):
        """One row per die: node, npu, die_in_npu, busy time per op type (busy_<TYPE>_ps), any_busy_ps,
        exposed_comm_ps, bytes_sent, bytes_received, hbm_read_bytes, hbm_write_bytes."""
        c = self.dies_columns()
        cols = {"die": np.arange(c["node"].size, dtype=np.int32), "node": c["node"], "npu": c["npu"],
                "die_in_npu": c["die_in_npu"]}
        for i, t in enumerate(self.op_types):
            cols[f"busy_{t}_ps"] = c["busy_ps"][:, i]
        for k in ("any_busy_ps", "exposed_comm_ps", "bytes_sent", "bytes_received", "hbm_read_bytes",
                  "hbm_write_bytes"):
            cols[k] = c[k]
        return _table(cols, self.as_numpy)

    # -- names -----------------------------------------------------------------------------
    def die_name(self, die: int) -> str:
        s = self.spec
        per_npu, per_node = int(s["dies_per_npu"]), int(s["npus_per_node"]) * int(s["dies_per_npu"])
        return f"node {die // per_node} / NPU {(die % per_node) // per_npu} / die {die % per_npu}"

    def vertex_names(self) -> np.ndarray:
        """A name for every vertex of the topology (numbering of docs/timeline-format.md)."""
        s = self.spec
        ub = s["ub"]
        nodes, planes, chips = int(s["nodes"]), int(ub["sub_planes"]), int(ub["l2_chips_per_sub_plane"])
        cpus_per_node = int(s["cpus_per_node"])
        names = [self.die_name(d) for d in range(self.dies_count)]
        names += [f"node {c // cpus_per_node} / CPU {c % cpus_per_node}" for c in range(nodes * cpus_per_node)]
        names += [f"node {n} / L1 plane {p}" for n in range(nodes) for p in range(planes)]
        names += [f"L2 plane {p} / chip {c}" for p in range(planes) for c in range(chips)]
        names.append("RDMA switch")
        if "vpc" in s:  # the VPC plane (timelines of cmemu with the VPC plane in the topology)
            names += [f"node {n} / DPU" for n in range(nodes)]
            names.append("VPC switch")
        return np.asarray(names, dtype=object)

    # -- figures ---------------------------------------------------------------------------
    def summary(self) -> dict:
        """The run in figures, units in the keys (JSON-able). See ``cmemu report``."""
        return summarize(self)


def _enum_names(ds, default) -> tuple:
    """Names by code of an HDF5 enum dataset (``default`` if it is not an enum)."""
    mapping = h5py.check_enum_dtype(ds.dtype)
    if not mapping:
        return tuple(default)
    names = [None] * (max(mapping.values()) + 1)
    for name, code in mapping.items():
        names[code] = name
    return tuple(n if n is not None else f"code {i}" for i, n in enumerate(names))


def _one_line(exc) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _plain(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.generic):
        return v.item()
    return v


def summarize(t: Timeline) -> dict:
    """Makespan, time per op type, exposed communication, link and HBM utilisation."""
    end = t.sim_end_ps
    ops = t.columns("ops")
    d = t.dies_columns()
    dur = ops["end_ps"] - ops["start_ps"]
    dies = d["node"].size
    active = d["any_busy_ps"] > 0
    op_types = {}
    for i, name in enumerate(t.op_types):
        sel = ops["type"] == i
        if not sel.any():
            continue
        busy = d["busy_ps"][:, i]
        op_types[name] = {
            "count": int(sel.sum()),
            "total_time_us": float(dur[sel].sum()) / 1e6,
            "busy_time_per_active_die_mean_us": float(busy[active].mean()) / 1e6 if active.any() else 0.0,
            "busy_time_per_die_max_us": float(busy.max()) / 1e6,
        }
    exposed = d["exposed_comm_ps"]
    links = t.columns("links")
    kinds = {}
    util = links["busy_ps"] / end if end > 0 else np.zeros(links["busy_ps"].shape)
    for k, name in enumerate(t.link_kinds):
        sel = links["kind"] == k
        if not sel.any():
            continue
        used = sel & (links["bytes"] > 0)
        kinds[name] = {
            "links": int(sel.sum()),
            "links_used": int(used.sum()),
            "bytes": int(links["bytes"][sel].sum()),
            "utilisation_mean_percent": 100.0 * float(util[sel].mean()),
            "utilisation_mean_of_used_percent": 100.0 * float(util[used].mean()) if used.any() else 0.0,
            "utilisation_max_percent": 100.0 * float(util[sel].max()),
        }
    ub = np.isin(links["kind"], [k for k, name in enumerate(t.link_kinds) if name.startswith("ub_")])
    ub_capacity = float((links["rate_byte_per_s"][ub]).sum()) * end / 1e12
    return {
        "preset": t.attrs.get("preset"),
        "dies": dies,
        "makespan_us": end / 1e6,
        "ops": int(dur.size),
        "messages": int(t._rows["messages"]),
        "message_bytes": int(t.columns("messages")["bytes"].sum()),
        "op_types": op_types,
        "exposed_comm": {
            "total_us": float(exposed.sum()) / 1e6,
            "per_active_die_mean_us": float(exposed[active].mean()) / 1e6 if active.any() else 0.0,
            "per_die_max_us": float(exposed.max()) / 1e6 if dies else 0.0,
            "die_max": int(exposed.argmax()) if dies else -1,
            "share_of_makespan_max_percent": 100.0 * float(exposed.max()) / end if end > 0 and dies else 0.0,
        },
        "ub_utilisation_percent": 100.0 * float(links["bytes"][ub].sum()) / ub_capacity if ub_capacity else 0.0,
        "link_kinds": kinds,
        "hbm": hbm_summary(t, d, active),
        "tasks": t.tasks_status(),
        "pipes": pipe_figures(t),
        "link_bins": "recorded" if t.has_link_bins() else "not recorded",
    }


HBM_SOURCE_BINNED = ("every op's HBM traffic in /dies/hbm_binned: COMP ops' reads and writes (die model), "
                     "MEM_LOAD/MEM_STORE, collectives' loads, DMA reads and copies")
HBM_SOURCE_MEM_OPS = "MEM_LOAD/MEM_STORE bytes only"


def hbm_summary(t: Timeline, d: dict, active) -> dict:
    """HBM utilisation per die over the makespan against the die's capacity (``summary.hbm_capacity``),
    from /dies/hbm_binned (and the busiest stack from /dies/hbm_stack_binned, v4). A file without
    them (older than v3, or a run with --link-bin-ns 0) falls back to the MEM op bytes, with a note."""
    rate, capacity = hbm_capacity(t.spec)
    end = t.sim_end_ps
    note = None
    stacks = bins = None
    if t.has_hbm_bins():
        c = t.columns("dies/hbm_binned")
        die_bytes = np.bincount(c["die"], weights=c["bytes"], minlength=t.dies_count).astype(np.int64)
        bins = (c["die"], c["bin"], c["bytes"], t.hbm_bin_ps)
        source = HBM_SOURCE_BINNED
        if t.has_hbm_stack_bins():
            sc = t.columns("dies/hbm_stack_binned")
            stacks = (sc["die"], sc["stack"], sc["bytes"], t.hbm_stacks)
        else:
            note = "no busiest stack: the file has no /dies/hbm_stack_binned (layout v4 added it)"
    else:
        die_bytes = d["hbm_read_bytes"] + d["hbm_write_bytes"]
        source = HBM_SOURCE_MEM_OPS
        why = (f"layout version {t.version} has no /dies/hbm_binned" if t.version < ADDED_IN["dies/hbm_binned"]
               else "the run binned no counters (--link-bin-ns 0)")
        note = f"{why}: COMP ops' and collectives' HBM traffic is not counted"
    out = {"source": source, "capacity": capacity}
    out.update(hbm_figures(die_bytes, end, rate, active, stacks=stacks, bins=bins))
    out["nominal_gbyte_per_s"] = float(t.spec["die"]["hbm_bandwidth_gbyte_per_s"])
    out["note"] = note
    return out


def pipe_figures(t: Timeline) -> dict:
    """Per pipe/engine with tasks: count, summed task time, and the busy share per die (time at
    least one task of the pipe runs, over the makespan). Core utilisation is not derived: a task
    does not say how many cores it occupies."""
    if not t.has_tasks():
        return {}
    c = t.columns("tasks")
    end = t.sim_end_ps
    dies = t.dies_count
    die, pipe = c["die"].astype(np.int64), c["pipe"].astype(np.int64)
    dur = c["end_ps"] - c["start_ps"]
    npipes = len(t.pipes)
    busy = busy_union_ps(die * npipes + pipe, c["start_ps"], c["end_ps"], dies * npipes).reshape(dies, npipes)
    out = {}
    for k, name in enumerate(t.pipes):
        sel = pipe == k
        if not sel.any():
            continue
        used = np.unique(die[sel])
        fig = {"tasks": int(sel.sum()), "total_time_us": float(dur[sel].sum()) / 1e6,
               "dies": int(used.size),
               "busy_per_die_mean_percent": 100.0 * float(busy[used, k].mean()) / end if end else 0.0}
        out[name] = fig
    return out


def busiest_links(t: Timeline, n: int = 10) -> list[dict]:
    """The n links with the most busy time: link, kind, src, dst, bytes, utilisation_percent."""
    c = t.columns("links")
    names = t.vertex_names()
    order = np.lexsort((np.arange(c["busy_ps"].size), -c["busy_ps"]))[:n]
    end = t.sim_end_ps
    return [{
        "link": int(i), "kind": t.link_kinds[c["kind"][i]],
        "src": names[c["src_vertex"][i]], "dst": names[c["dst_vertex"][i]],
        "bytes": int(c["bytes"][i]),
        "utilisation_percent": 100.0 * float(c["busy_ps"][i]) / end if end > 0 else 0.0,
    } for i in order if c["busy_ps"][i] > 0]
