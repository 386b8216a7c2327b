"""The codes cmemu's layers share, in one place: the names a user chooses between (engines,
fabric models, timeline detail levels, compressions) and, for the engine, the integer codes of
op kinds, node types, pipes, packet and message kinds, planes and load-balancing modes.

Plain Python with no imports, below every layer (tests/test_layers.py): the trace checker, the
lowering, the engine (mirrored for Cython in cmemu/_core/vocab.pxd, checked equal by a test), the
timeline writer and reader and the CLI all read their codes from here.
"""
from __future__ import annotations

# -- what a run is asked for (`cmemu run` options) ---------------------------------------------
ENGINES = ("native", "reference")  # the Cython kernel, or its pure-Python reference
FABRICS = ("packet", "message")  # fabric models; cmemu.lower.fabric.FABRIC_MODELS: each one's look-ahead
DETAILS = ("ops", "tasks", "packets")  # what the timeline records
COMPRESSIONS = ("gzip", "lzf", "none")  # of the timeline's datasets
