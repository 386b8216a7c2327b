"""Trace IR: the native operator trace cmemu replays (docs/trace-format.md).

Its modules: ``vocab`` (the format's own words and ranges), ``model`` (the loaded nodes, the trace
and its graph as arrays), ``read`` (a file or a document in memory), ``check`` (every problem of a
document; ``load_trace`` checks as it builds the nodes), ``writer`` (the one trace writer), and the
generators (``deepseek``, ``kv_transfer``, ``ems_fetch``) and ``importers``.

Usage::

    from cmemu.trace import load_trace
    trace = load_trace("traces/examples/pingpong.json", num_ranks=spec.dies)
"""
from cmemu.trace.check import check_trace, load_trace
from cmemu.trace.model import Node, Trace, match_messages, stream_predecessors
from cmemu.trace.read import TraceDocument, read_document, read_trace, schema_path
from cmemu.units import ns_to_ps
from cmemu.vocab import NODE_TYPES

__all__ = [
    "NODE_TYPES",
    "Node",
    "Trace",
    "TraceDocument",
    "check_trace",
    "load_trace",
    "match_messages",
    "ns_to_ps",
    "read_document",
    "read_trace",
    "schema_path",
    "stream_predecessors",
]
