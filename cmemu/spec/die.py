"""The die: one Ascend 910C die, the unit software sees as a rank (docs/machine.md sections 2.1-2.3).

Units in every field name; provenance in ``sources`` (filled from the ascend910c preset).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from cmemu.spec.common import _frozen_map, _require_positive


@dataclass(frozen=True)
class DieSpec:
    """One Ascend 910C die: the unit software sees as a rank (docs/machine.md section 2.1)."""

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
    # Inside a core (docs/machine.md 2.2): buffers bound tile sizes, pipes move bytes at these rates.
    l1_buffer_kib: int
    l0a_buffer_kib: int
    l0b_buffer_kib: int
    l0c_buffer_kib: int
    ub_buffer_kib: int
    mte2_byte_per_cycle: int
    aiv_mte2_byte_per_cycle: int
    mte2_startup_cycles: int
    mte1_l0a_byte_per_cycle: int
    mte1_l0b_byte_per_cycle: int
    mte1_startup_cycles: int
    cube_startup_cycles: int
    fixpipe_byte_per_cycle: int
    fixpipe_startup_cycles: int
    vector_startup_cycles: int
    mte3_byte_per_cycle: int
    mte3_startup_cycles: int
    cross_core_flag_latency_cycles: int
    # L2 cache (docs/machine.md 2.1).
    l2_line_byte: int
    l2_hit_latency_cycles: int
    l2_to_hbm_bandwidth_ratio: float
    # HBM organisation and timings (docs/machine.md 2.1, 2.3).
    hbm_stacks: int
    hbm_channels_per_stack: int
    hbm_pseudo_channels_per_channel: int
    hbm_channel_width_bit: int
    hbm_pin_rate_gbit_per_s: float
    hbm_bank_groups: int
    hbm_banks_per_group: int
    hbm_burst_length: int
    hbm_row_byte: int
    hbm_interleave_byte: int
    hbm_queue_requests: int
    hbm_write_batch_requests: int
    hbm_tcl_ns: float
    hbm_tcwl_ns: float
    hbm_trcd_ns: float
    hbm_trp_ns: float
    hbm_tras_ns: float
    hbm_trrd_ns: float
    hbm_tfaw_ns: float
    hbm_twr_ns: float
    hbm_trtp_ns: float
    hbm_twtr_ns: float
    hbm_trtw_ns: float
    hbm_trfc_ns: float
    hbm_trefi_ns: float
    sources: Mapping[str, str] = field(default_factory=_frozen_map, compare=False)

    def __post_init__(self):
        _require_positive(self, "die")
        if self.hbm_channel_width_bit < 8 * self.hbm_pseudo_channels_per_channel:
            raise ValueError(f"die.hbm_channel_width_bit ({self.hbm_channel_width_bit}) must give each of the "
                             f"{self.hbm_pseudo_channels_per_channel} pseudo-channels of a channel at least 8 bits")
        if self.hbm_trp_ns + self.hbm_trfc_ns >= self.hbm_trefi_ns:
            # Otherwise the HBM model never gets past its refreshes (and real HBM would do no work).
            raise ValueError(f"die.hbm_trp_ns + die.hbm_trfc_ns ({self.hbm_trp_ns:g} + {self.hbm_trfc_ns:g} ns) must "
                             f"be less than die.hbm_trefi_ns ({self.hbm_trefi_ns:g} ns): a refresh must end before "
                             "the next one is due")

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

    @property
    def hbm_pseudo_channels(self) -> int:
        """Pseudo-channels of the die's HBM: the independent servers of the HBM model."""
        return self.hbm_stacks * self.hbm_channels_per_stack * self.hbm_pseudo_channels_per_channel

    @property
    def hbm_pin_peak_byte_per_s(self) -> float:
        """Physical peak: every data pin of every stack busy (the ceiling no model may exceed)."""
        pins = self.hbm_stacks * self.hbm_channels_per_stack * self.hbm_channel_width_bit
        return pins * self.hbm_pin_rate_gbit_per_s * 1e9 / 8
