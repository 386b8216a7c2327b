"""The trace format's own words (docs/trace-format.md): its schema name and version, the
collectives and their engines, the header's and a node's fields, the fault schedule's keys, and
the ranges a value must lie in. The codes other layers share (node types, planes, COMP operators)
are cmemu.vocab's; the largest integer a trace holds is cmemu.units.MAX_TRACE_INT.
"""
from __future__ import annotations

SCHEMA = "cmemu.trace"
VERSION = 1
# Collectives (COMM_COLL comm_type), with the engines that can run them (the first is the default).
COLL_TYPES = ("ALL_TO_ALL", "ALL_GATHER", "REDUCE_SCATTER", "ALL_REDUCE", "BROADCAST", "MOE_DISPATCH",
              "MOE_COMBINE")
COLL_ENGINES = ("sdma", "aiv")
MOE_TYPES = ("MOE_DISPATCH", "MOE_COMBINE")
MOE_KERNELS = ("low_latency", "normal")  # cmemu.lower.moe.KERNELS: the fused kernels on AIV-Direct

# The core's clock is an int64 count of picoseconds; 2**62 leaves headroom for sums of durations.
MAX_PS = 2**62
# Streams are int32 in the lowered arrays and the timeline.
MAX_STREAM = 2**31 - 1

HEADER_KEYS = frozenset({"schema", "version", "time_unit", "system", "description", "groups", "nodes"})
NODE_KEYS = frozenset({"id", "name", "type", "rank", "stream", "data_deps", "ctrl_deps", "attrs"})

# A fault schedule entry: the part (as --fail names it) and when it fails (0: from the start).
FAULT_KEYS = ("fail", "at_ns")
# A failure during a run must land on the clock: its time in ps below 2**62 (at_ns below 2**52).
MAX_FAULT_NS = 2**52
