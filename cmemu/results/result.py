"""What one replay produced (``RunResult``): the engine's whole run, and the user's view of it
(``cmemu.results.view.trace_result``: the trace's own ops and messages), which the timeline
writer takes (docs/timeline-format.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cmemu.lower import Lowered
from cmemu.spec import SystemSpec
from cmemu.topology import Topology


@dataclass
class RunResult:
    """What one replay produced. Times are integer picoseconds."""

    spec: SystemSpec
    topology: Topology
    trace: object
    lowered: Lowered
    op_start_ps: np.ndarray
    op_end_ps: np.ndarray
    link_bytes: np.ndarray
    link_busy_ps: np.ndarray
    events: int
    max_pending_events: int
    wall_time_s: float  # until the results were whole (run_trace: the writing aside, as it can be)
    native: bool
    # Optional records, None until a model produces them (docs/timeline-format.md, v2):
    # tasks: per pipe/engine task columns (cmemu.output.schema.TASK_FIELDS), written to /tasks;
    # link_series: binned link counters, sparse COO {"bin_ps", "link", "bin", "bytes", "busy_ps"}
    # (schema.LINK_SERIES_FIELDS), written to /links/binned.
    tasks: dict | None = None
    link_series: dict | None = None
    msg_packets: np.ndarray | None = None  # int64: packets each message was cut into (as msg_delivered_ps)
    # int64: when each message's last byte was in memory, for the first messages only in a run of a
    # trace (Lowered.leading_trace_messages: the trace's own, the ones /messages holds)
    msg_delivered_ps: np.ndarray | None = None
    packets_sent: int = 0  # packet transmissions, one per packet per link
    packets_lost: int = 0  # packets lost on links that failed during the run (and sent again)
    hbm_series: dict | None = None  # {"bin_ps", "die", "bin", "bytes"}: HBM bytes per die and time bin
    # {"bin_ps", "stacks", "die", "stack", "bin", "bytes"}: the same per HBM stack (sums to hbm_series)
    hbm_stack_series: dict | None = None
    # {"dispatch_op", "combine_op"}: each MOE_COMBINE with the MOE_DISPATCH it returns the tokens of
    moe_pairs: dict | None = None
    pipe_tasks: dict | None = None  # the COMP ops' pipe intervals (pipe_interval_tasks), /tasks rows
    pipe_intervals: int | None = None  # at most this many per COMP op and pipe in pipe_tasks
    # --detail packets: every packet's transmission on every link (schema.PACKET_FIELDS), to /packets
    packets: dict | None = None
    hbm_clock: dict | None = None  # Engine.hbm_clock(): each die's HBM share (its level) after every change
    hbm_shared_ops: np.ndarray | None = None  # Engine.hbm_shared_ops: the ops that shared it
    hbm_shared_demand: np.ndarray | None = None  # Engine.hbm_shared_demand: their demands, bytes/s
    fabric_messages: int = 0  # every message the run moved, collectives' included
    fabric_packets: int = 0
    fabric_bytes: int = 0
    fabric_model: str = "packet"  # cmemu.fabric.FABRIC_MODELS: how messages moved
    retime: object = None  # cmemu.lower.retime.RetimeReport of a run with retime=True
    compile_s: float = 0.0  # of wall_time_s, the time Numba spent compiling kernels (cmemu.kernels; first runs)

    @property
    def sim_end_ps(self) -> int:
        return int(self.op_end_ps.max()) if self.op_end_ps.size else 0
