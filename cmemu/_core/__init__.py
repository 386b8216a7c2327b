"""The native core: the Cython event kernel (``engine``) and its pure-Python reference.

``make_engine(lowered, native=True)`` is the one way the rest of cmemu builds an engine.
"""


def make_engine(lowered, native: bool = True):
    """An engine over lowered arrays: the Cython kernel, or the pure-Python reference."""
    if native:
        from cmemu._core.engine import Engine
    else:
        from cmemu._core.reference import Engine
    return Engine(lowered)
