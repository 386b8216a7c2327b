"""Helpers shared by the spec dataclasses."""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Mapping


def _frozen_map(m=None) -> Mapping[str, str]:
    return MappingProxyType(dict(m or {}))


def _require_positive(obj, section: str) -> None:
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not v > 0:
            name = f"{section}.{f.name}" if section else f.name
            raise ValueError(f"{name} must be > 0, got {v!r}")
