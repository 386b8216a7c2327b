"""The native core: the Cython event kernel (``engine``) and its pure-Python reference.

``make_engine(lowered, fabric, native=True)`` is the one way the rest of cmemu builds an engine.
"""


def make_engine(lowered, fabric, native: bool = True, bin_ps: int = 0):
    """An engine over lowered arrays and a fabric: the Cython kernel, or the pure-Python reference.

    ``bin_ps`` > 0 also collects per-link bytes and busy time in bins of that width.
    """
    if native:
        from cmemu._core.engine import Engine
    else:
        from cmemu._core.reference import Engine
    return Engine(lowered, fabric, bin_ps)
