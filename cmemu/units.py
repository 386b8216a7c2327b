"""Unit conversions shared by every layer (the core keeps time in integer picoseconds), and memory
sizes: parsed (decimal and binary units), formatted, and the default limit of a run; and message
sizes as scenarios take them (64, 4K, 1M: powers of 1024, as message sizes are given).

Two conventions, on purpose: a memory size is what ``free`` and cgroups print (GB = 10**9, GiB =
2**30), a message size what the paper's tables use (4K = 4096 bytes)."""
from __future__ import annotations

import os

from cmemu.errors import CmemuError


def ns_to_ps(value_ns: int | float) -> int:
    """Nanoseconds (as in traces and presets) to the core's integer picoseconds (nearest)."""
    if type(value_ns) is int:
        return value_ns * 1000
    return round(value_ns * 1000)


def parse_memory_size(text: str) -> int:
    """Bytes from a size such as ``2GB``, ``512MiB``, ``1.5 GiB`` or ``1000000`` (bytes).

    Decimal (kB, MB, GB, TB) and binary (KiB, MiB, GiB, TiB) units; a lower-case ``b`` would
    mean bits, which cmemu never uses for memory, so it is refused.
    """
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    s = str(text).strip()
    num = s.rstrip("bBkKmMgGtTiI ")
    unit = s[len(num):].strip()
    if unit.endswith("b"):
        raise ValueError(f"{text!r}: 'b' means bits; write memory sizes in bytes, e.g. 2GB or 512MiB")
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit.upper() not in units or not value >= 0 or value == float("inf"):
        raise ValueError(f"{text!r} is not a memory size; write e.g. 2GB, 512MiB or 1000000 (bytes)")
    return int(value * units[unit.upper()])


def default_memory_limit() -> int:
    """Three quarters of physical memory, or of the cgroup's limit when that is lower."""
    try:
        limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        limit = 8 * 2**30
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = min(limit, int(f.read().strip()))
        except (OSError, ValueError):
            continue
    return limit * 3 // 4


def format_bytes(n: float) -> str:
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n)} B"


_SIZE_SUFFIX = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 2**20, "MB": 2**20, "MIB": 2**20,
                "G": 2**30, "GB": 2**30, "GIB": 2**30}


# The largest integer a trace holds (its ids, sizes and counts; cmemu.trace.check): JSON numbers
# beyond 2**53 are not exact in a double, so no tool chain can be trusted with them. An int64 holds it.
MAX_TRACE_INT = 2**53


def parse_sizes(text: str) -> list[int]:
    """Byte sizes from ``64,512,4K,1M`` (K, M, G are powers of 1024 here, as message sizes are)."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        num = part.rstrip("kKmMgGiIbB")
        suffix = part[len(num):].upper()
        if not (num.isascii() and num.isdigit()) or suffix not in _SIZE_SUFFIX or int(num) * _SIZE_SUFFIX[suffix] <= 0:
            raise CmemuError(f"'{part[:40]}' is not a size in bytes (e.g. 64, 4K, 1M)")
        if int(num) * _SIZE_SUFFIX[suffix] > MAX_TRACE_INT:
            raise CmemuError(f"'{part[:40]}' is more than 2**53 bytes, the largest size a trace holds")
        out.append(int(num) * _SIZE_SUFFIX[suffix])
    return out


def parse_size(text: str, option: str) -> int:
    """One byte size (parse_sizes' forms) for ``option``, which takes one: a list is an error."""
    sizes = parse_sizes(text)
    if len(sizes) != 1:
        raise CmemuError(f"{option} takes one size in bytes (e.g. 4K), not a list: '{str(text)[:40]}'")
    return sizes[0]
