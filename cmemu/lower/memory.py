"""MEM_LOAD / MEM_STORE: transfers between a die's HBM and the chip, timed by the HBM model.

A transfer moves ``tensor_size`` bytes at the bandwidth the HBM model (cmemu/die/hbm.py:
pseudo-channels, banks, rows, turnaround, refresh) achieves for a sequential read (load) or
write (store) stream, and ends one access latency later (347 cycles read, 203 write [CYC]: what
a core sees for its first burst). At run time it shares the die's HBM with the other MEM and
COMP ops running there (cmemu._core.hbm_sharing); engine inputs built without a die capacity
keep one FIFO HBM server per die instead.
"""
from __future__ import annotations

import math

from cmemu.spec.model import DieSpec


def hbm_bandwidth_byte_per_s(die: DieSpec, store: bool = False) -> float:
    """Achieved streaming bandwidth of the die's HBM (sequential, 512 B granules)."""
    from cmemu.die.model import DieModel

    m = DieModel.of(die)
    per_cycle = m.hbm_write_byte_per_cycle if store else m.hbm_read_byte_per_cycle
    return per_cycle * die.ai_core_clock_mhz * 1e6


def hbm_service_ps(nbytes: int, die: DieSpec, store: bool = False) -> int:
    if nbytes <= 0:
        return 0
    return int(math.ceil(nbytes * 1e12 / hbm_bandwidth_byte_per_s(die, store)))


def hbm_latency_ps(die: DieSpec, store: bool) -> int:
    cycles = die.hbm_write_latency_cycles if store else die.hbm_read_latency_cycles
    return int(round(cycles * 1e6 / die.ai_core_clock_mhz))
