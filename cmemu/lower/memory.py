"""MEM_LOAD / MEM_STORE: the HBM stand-in (issue 4 replaces it with stacks and channels).

Each die's HBM is one FIFO server: an access occupies it for ``tensor_size`` bytes at the die's
HBM rate, then completes after the read (load) or write (store) latency. Not modelled: banks,
rows, refresh, the L2 cache, sharing bandwidth between concurrent accesses (they queue).
"""
from __future__ import annotations

import math

from cmemu.spec.model import DieSpec


def hbm_service_ps(nbytes: int, die: DieSpec) -> int:
    return int(math.ceil(nbytes * 1e12 / (die.hbm_bandwidth_gbyte_per_s * 1e9)))


def hbm_latency_ps(die: DieSpec, store: bool) -> int:
    cycles = die.hbm_write_latency_cycles if store else die.hbm_read_latency_cycles
    return int(round(cycles * 1e6 / die.ai_core_clock_mhz))
