"""Unit conversions shared by every layer (the core keeps time in integer picoseconds)."""


def ns_to_ps(value_ns: int | float) -> int:
    """Nanoseconds (as in traces and presets) to the core's integer picoseconds (nearest)."""
    if type(value_ns) is int:
        return value_ns * 1000
    return round(value_ns * 1000)
