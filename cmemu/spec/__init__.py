"""Hardware spec: typed, unit-named, sourced values loaded from the TOML presets shipped here.

Usage::

    from cmemu.spec import load_system
    spec = load_system("mini", overrides=["ub.link_rate_gbit_per_s=200"])
"""
from cmemu.spec.load import DEFAULT_SYSTEM, list_presets, load_system, parse_override
from cmemu.spec.model import D2DSpec, DieSpec, RDMASpec, SystemSpec, UBSpec

__all__ = [
    "DEFAULT_SYSTEM",
    "D2DSpec",
    "DieSpec",
    "RDMASpec",
    "SystemSpec",
    "UBSpec",
    "list_presets",
    "load_system",
    "parse_override",
]
