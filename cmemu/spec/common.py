"""Helpers shared by the spec dataclasses, and the sane range of every physical field.

Every number of a spec (a preset's, or one ``--set`` gives) must be finite, positive and within
a range: what the hardware could plausibly be, with room to spare on both sides, and what the
model's integer arithmetic holds. Times become integer picoseconds (1 ps is the clock's tick, and
a run's clock holds 2**62 ps); rates become integer bytes per second, and a packet's bytes times
10**12 over such a rate must fit an int64; an op's cores are counted in one byte by the engine.
A value outside its range is refused with a message naming the field and the range.
"""
from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import Mapping


def _frozen_map(m=None) -> Mapping[str, str]:
    return MappingProxyType(dict(m or {}))


# (low, high, unit) by the end of a field's name: the unit it is written in.
_RANGE_OF_UNIT = (
    ("_ns", 1e-3, 1e9, "ns (1 ps, the clock's tick, to 1 s)"),
    ("_cycles", 1, 10**6, "cycles"),
    ("_mhz", 1.0, 1e5, "MHz"),
    ("_gbit_per_s", 1e-3, 1e6, "Gbit/s"),
    ("_gbyte_per_s", 1e-3, 1e6, "GB/s"),
    ("_gbyte_per_s_per_node", 1e-3, 1e6, "GB/s"),
    ("_byte_per_cycle", 1, 2**20, "B per cycle"),
    ("_bytes_per_cycle", 1, 2**20, "B per cycle"),
    ("_kib", 1, 2**20, "KiB"),
    ("_mib", 1, 2**16, "MiB"),
    ("_gbyte", 1e-3, 1e6, "GB"),
    ("_gbyte_per_cpu", 1e-3, 1e6, "GB"),
    ("_byte", 1, 2**20, "B"),
    ("_bit", 1, 2**12, "bit"),
    ("_ratio", 1e-3, 1e3, ""),
)
# Fields whose range is their own (section.field, or the field alone for the system's).
_RANGE_OF_FIELD = {
    "die.aic_cores": (1, 255, "cores (the engine counts an op's cores of one kind in one byte)"),
    "die.aiv_cores": (1, 255, "cores (the engine counts an op's cores of one kind in one byte)"),
    # The cube works on 16 x k x 16 blocks, k >= 1: at least 256 MACs a cycle.
    "die.cube_macs_per_cycle_bf16": (256, 2**20, "MACs per cycle"),
    "die.cube_macs_per_cycle_int8": (256, 2**20, "MACs per cycle"),
    # fp32 vector lanes are bytes / 4, times two (fused multiply-add): at least one a cycle.
    "die.vector_bytes_per_cycle": (2, 2**20, "B per cycle"),
    "die.hbm_stacks": (1, 64, "stacks"),
    "die.hbm_channels_per_stack": (1, 64, "channels"),
    "die.hbm_pseudo_channels_per_channel": (1, 16, "pseudo-channels"),
    "die.hbm_bank_groups": (1, 64, "bank groups"),
    "die.hbm_banks_per_group": (1, 64, "banks"),
    "die.hbm_burst_length": (1, 64, "beats"),
    "die.hbm_queue_requests": (1, 2**16, "requests"),
    # The HBM model simulates a pseudo-channel's requests for 20 us at its peak rate, granule by
    # granule: its work grows with the pin rate and shrinks with the interleave granule.
    "die.hbm_pin_rate_gbit_per_s": (0.1, 50.0, "Gbit/s per pin"),
    "die.hbm_interleave_byte": (32, 2**20, "B"),
    "die.hbm_write_batch_requests": (1, 2**16, "requests"),
    "ub.sub_planes": (1, 64, "planes"),
    "ub.die_ports": (1, 64, "ports"),
    "ub.cpu_ports": (1, 64, "ports"),
    "ub.l1_uplinks_per_chip": (1, 1024, "links"),
    "ub.l2_chips_per_sub_plane": (1, 1024, "chips"),
    "ub.l2_ports_per_chip": (1, 2**16, "ports"),
    "ub.max_outstanding_packets": (1, 2**20, "packets"),
    "ub.vl_buffer_byte": (1, 2**30, "B"),
    "comm.sdma_engines": (1, 1024, "engines"),
    "ems.block_tokens": (1, 2**20, "tokens"),
    "nodes": (1, 4096, "nodes"),
    "npus_per_node": (1, 256, "NPUs"),
    "dies_per_npu": (1, 2, "dies (one, or two joined by the die-to-die link)"),
    "cpus_per_node": (1, 256, "CPUs"),
}


def field_range(name: str):
    """(low, high, unit) of a numeric field (``section.field``, or a system field alone)."""
    if name in _RANGE_OF_FIELD:
        return _RANGE_OF_FIELD[name]
    for suffix, lo, hi, unit in sorted(_RANGE_OF_UNIT, key=lambda r: -len(r[0])):
        if name.endswith(suffix):
            return lo, hi, unit
    return 1, 2**31 - 1, ""


def _fmt(v) -> str:
    if isinstance(v, int) and v >= 2**10 and v & (v - 1) == 0:
        return f"{v:,} (2**{v.bit_length() - 1})"
    if isinstance(v, int) or (v >= 1 and float(v).is_integer()):
        return f"{int(v):,}"
    return f"{v:g}"


def _require_positive(obj, section: str) -> None:
    """Every number of a spec part within its sane range (``field_range``): finite, positive."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        name = f"{section}.{f.name}" if section else f.name
        lo, hi, unit = field_range(name)
        if not (isinstance(v, int) or math.isfinite(v)) or not lo <= v <= hi:
            shown = repr(v) if len(repr(v)) <= 30 else f"a {len(str(abs(v)))}-digit number"
            raise ValueError(f"{name} must be between {_fmt(lo)} and {_fmt(hi)}{' ' + unit if unit else ''}, "
                             f"got {shown}")
