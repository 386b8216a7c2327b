"""One die compiled for the tile-schedule kernels: every rate, start-up cost, latency and buffer
of the DieSpec as integers (cycles of the AI-core clock, bytes), plus the HBM model's achieved
bandwidth. Built once per DieSpec and cached; the kernels never look up a name."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from cmemu.die.hbm import HBMParams, stream

# Pipes of one AIC and of one AIV, in the order the kernels index them (Ascend's lane names).
AIC_PIPES = ("MTE2", "MTE1", "CUBE", "FIXP")
AIV_PIPES = ("MTE2", "VECTOR", "MTE3")
DTYPE_BYTES = {"int8": 1, "fp16": 2, "bf16": 2, "fp32": 4}


@dataclass(frozen=True)
class OpCost:
    """What the die model says about one op: its time, each pipe's busy time summed over the
    cores it ran on, and its traffic. Every field carries its unit."""

    op: str
    duration_ps: int
    duration_cycles: int
    aic_cores: int
    aiv_cores: int
    # "AIC.CUBE" -> cycles over all the op's cores (read-only: costs are memoised and shared)
    pipe_busy_cycles: Mapping = field(default_factory=lambda: MappingProxyType({}))
    hbm_read_byte: int = 0
    hbm_write_byte: int = 0
    l2_hit_byte: int = 0
    macs: int = 0
    vector_byte: int = 0
    cube_peak_macs_per_cycle: int = 0  # of the cores used, for utilisation
    phases: tuple = ()  # the OpCosts of an op's phases, when it runs several back to back
    # "AIC.CUBE" -> (start, end) int64 cycle arrays: when the pipe was busy on at least one of
    # the op's cores, from the tile schedule, merged to at most pipeline.MAX_INTERVALS_PER_PIPE
    # intervals (cmemu.die.intervals.op_pipe_intervals reads them); empty when not recorded.
    pipe_intervals: Mapping = field(default_factory=lambda: MappingProxyType({}), compare=False, repr=False)
    schedule_cycles: int = 0  # the tile schedule's makespan (duration_cycles may be longer: HBM, L2 bound)

    @property
    def cube_utilisation(self) -> float:
        """Useful MACs / what the op's AICs could do in its duration."""
        if not self.macs or not self.duration_cycles:
            return 0.0
        return self.macs / (self.cube_peak_macs_per_cycle * self.aic_cores * self.duration_cycles)

    @property
    def hbm_byte(self) -> int:
        return self.hbm_read_byte + self.hbm_write_byte

    @property
    def hbm_gbyte_per_s(self) -> float:
        return self.hbm_byte / self.duration_ps * 1e3 if self.duration_ps else 0.0

    @property
    def duration_us(self) -> float:
        return self.duration_ps / 1e6


@dataclass(frozen=True, eq=False)
class DieModel:
    die: object  # DieSpec
    hbm: HBMParams
    cycle_ps: float
    hbm_read_latency_cycles: int
    hbm_write_latency_cycles: int
    l2_hit_latency_cycles: int
    l2_capacity_byte: int
    hbm_read_byte_per_cycle: float  # achieved, sequential streaming, from the HBM model
    hbm_write_byte_per_cycle: float
    hbm_copy_byte_per_cycle: float  # reads and writes in equal parts (bus turnarounds included)
    l2_byte_per_cycle: float

    @classmethod
    def of(cls, die) -> "DieModel":
        return _model_of(die)

    def cycles_to_ps(self, cycles: int) -> int:
        return int(round(cycles * self.cycle_ps))

    def macs_per_cycle(self, dtype: str) -> int:
        if dtype in ("bf16", "fp16"):
            return self.die.cube_macs_per_cycle_bf16
        if dtype == "int8":
            return self.die.cube_macs_per_cycle_int8
        raise ValueError(f"the cube has no {dtype} mode in this model (use bf16, fp16 or int8)")

    def k_granule(self, dtype: str) -> int:
        """Depth of one cube step: a 16 x k x 16 block per cycle (k = 16 bf16, 32 int8)."""
        return self.macs_per_cycle(dtype) // 256

    def mte2_milli_byte_per_cycle(self, aiv: bool = False) -> int:
        """One core's MTE2 rate (an AIC's, or an AIV's), in thousandths of a byte per cycle
        (integers for the kernels)."""
        return int((self.die.aiv_mte2_byte_per_cycle if aiv else self.die.mte2_byte_per_cycle) * 1000)

    def hbm_read_milli_byte_per_cycle(self) -> int:
        return int(self.hbm_read_byte_per_cycle * 1000)


@lru_cache(maxsize=16)
def _model_of(die) -> DieModel:
    hp = HBMParams.from_die(die)
    cycle_ps = 1e6 / die.ai_core_clock_mhz
    rd = stream(hp, "read", hp.granule_byte, "sequential").bandwidth_byte_per_s
    wr = stream(hp, "write", hp.granule_byte, "sequential").bandwidth_byte_per_s
    cp = stream(hp, "copy", hp.granule_byte, "sequential").bandwidth_byte_per_s
    per_cycle = cycle_ps * 1e-12
    if min(rd, wr, cp) * per_cycle < 0.001:
        from cmemu.errors import SpecError

        # The kernels count HBM rates in thousandths of a byte per cycle.
        raise SpecError(f"the die's HBM timings leave it {min(rd, wr, cp) / 1e9:.3g} GB/s (read {rd / 1e9:.3g}, write "
                        f"{wr / 1e9:.3g}, copy {cp / 1e9:.3g}), less than 1/1000 B per AI-core cycle: the die.hbm_t*_ns "
                        "timings are too long for its pins")
    return DieModel(
        die=die,
        hbm=hp,
        cycle_ps=cycle_ps,
        hbm_read_latency_cycles=die.hbm_read_latency_cycles,
        hbm_write_latency_cycles=die.hbm_write_latency_cycles,
        l2_hit_latency_cycles=die.l2_hit_latency_cycles,
        l2_capacity_byte=die.l2_cache_mib << 20,
        hbm_read_byte_per_cycle=rd * per_cycle,
        hbm_write_byte_per_cycle=wr * per_cycle,
        hbm_copy_byte_per_cycle=cp * per_cycle,
        l2_byte_per_cycle=die.l2_to_hbm_bandwidth_ratio * die.hbm_bandwidth_gbyte_per_s * 1e9 * per_cycle,
    )


def ceil_div(a, b):
    return -(-a // b)


def cost_params(m: DieModel) -> np.ndarray:
    """The integer table the AIC kernels read (see gemm.P_*)."""
    d = m.die
    return np.array([
        d.mte2_startup_cycles, d.mte1_startup_cycles, d.cube_startup_cycles, d.fixpipe_startup_cycles,
        d.mte1_l0a_byte_per_cycle, d.mte1_l0b_byte_per_cycle, d.fixpipe_byte_per_cycle,
        m.l2_hit_latency_cycles, m.hbm_read_latency_cycles, m.l2_hit_latency_cycles,
        m.mte2_milli_byte_per_cycle(), m.hbm_read_milli_byte_per_cycle(),
    ], dtype=np.int64)


# Schedules beyond this many pipe instructions are refused rather than evaluated (memory and time
# grow with them: about 40 B and 10 ns per instruction).
MAX_INSTRUCTIONS = 50_000_000


def check_size(what: str, instructions: int) -> None:
    if instructions > MAX_INSTRUCTIONS:
        raise ValueError(f"{what} would need {instructions:,} pipe instructions, more than the die model "
                         f"evaluates ({MAX_INSTRUCTIONS:,}); split the op into smaller ones")


def hbm_cycles_for(model: DieModel, rd: float, wr: float) -> float:
    """Cycles the HBM needs for ``rd`` bytes read and ``wr`` written, streamed together: at the
    pure read/write rates when one kind dominates, at the copy rate (turnarounds included) when
    they are equal, in proportion between (both ends come from the HBM model)."""
    total = rd + wr
    if total <= 0:
        return 0.0
    pure = rd / model.hbm_read_byte_per_cycle + wr / model.hbm_write_byte_per_cycle
    mixed = total / model.hbm_copy_byte_per_cycle
    share = 2 * min(rd, wr) / total  # 0: one kind only, 1: half and half
    return max(pure, pure + (mixed - pure) * share)


def finish_cost(model: DieModel, op, makespan_cycles, aic, aiv, busy, rd, wr, hit, macs, vec_b, peak,
                intervals=None) -> OpCost:
    """The op's duration: its pipelines' makespan, but never less than its HBM traffic needs at
    the bandwidth the HBM model achieves, nor its L2 traffic at the L2's bandwidth.
    ``intervals``: the schedule's busy intervals per pipe (``pipeline.named_spans``)."""
    hbm_cycles = hbm_cycles_for(model, rd, wr)
    l2_cycles = (rd + wr + hit) / model.l2_byte_per_cycle
    cycles = int(max(makespan_cycles, np.ceil(hbm_cycles), np.ceil(l2_cycles)))
    return OpCost(op=op, duration_ps=model.cycles_to_ps(cycles), duration_cycles=cycles, aic_cores=aic,
                  aiv_cores=aiv, pipe_busy_cycles=MappingProxyType(dict(busy)), hbm_read_byte=rd, hbm_write_byte=wr, l2_hit_byte=hit,
                  macs=macs, vector_byte=vec_b, cube_peak_macs_per_cycle=peak,
                  pipe_intervals=MappingProxyType(dict(intervals or {})), schedule_cycles=int(makespan_cycles))
