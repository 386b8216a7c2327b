"""The die: one Ascend 910C die, the unit software sees as a rank (SPEC.md sections 2.1-2.3).

Units in every field name; provenance in ``sources`` (filled from the ascend910c preset).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from cmemu.spec.common import _frozen_map, _require_positive


@dataclass(frozen=True)
class DieSpec:
    """One Ascend 910C die: the unit software sees as a rank (SPEC.md section 2.1)."""

    aic_cores: int
    aiv_cores: int
    ai_core_clock_mhz: float
    cube_macs_per_cycle_bf16: int
    cube_macs_per_cycle_int8: int
    vector_bytes_per_cycle: int
    hbm_capacity_gbyte: float
    hbm_bandwidth_gbyte_per_s: float
    hbm_read_latency_cycles: int
    hbm_write_latency_cycles: int
    l2_cache_mib: int
    sources: Mapping[str, str] = field(default_factory=_frozen_map, compare=False)

    def __post_init__(self):
        _require_positive(self, "die")

    @property
    def cube_peak_flop_per_s_bf16(self) -> float:
        # One MAC is two floating-point operations.
        return self.aic_cores * self.cube_macs_per_cycle_bf16 * 2 * self.ai_core_clock_mhz * 1e6

    @property
    def cube_peak_op_per_s_int8(self) -> float:
        return self.aic_cores * self.cube_macs_per_cycle_int8 * 2 * self.ai_core_clock_mhz * 1e6

    @property
    def vector_peak_byte_per_s(self) -> float:
        return self.aiv_cores * self.vector_bytes_per_cycle * self.ai_core_clock_mhz * 1e6
