"""Trace IR: the native operator trace cmemu replays (docs/trace-format.md).

Usage::

    from cmemu.trace import load_trace
    trace = load_trace("traces/examples/pingpong.json", num_ranks=spec.dies)
"""
from cmemu.trace.ir import (
    Node,
    Trace,
    check_trace,
    load_trace,
    match_messages,
    ns_to_ps,
    read_trace,
    schema_path,
    stream_predecessors,
)
from cmemu.vocab import NODE_TYPES

__all__ = [
    "NODE_TYPES",
    "Node",
    "Trace",
    "check_trace",
    "load_trace",
    "match_messages",
    "ns_to_ps",
    "read_trace",
    "schema_path",
    "stream_predecessors",
]
