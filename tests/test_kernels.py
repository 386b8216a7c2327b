"""cmemu.kernels: Numba's compiles are timed and told once (the first run's compile is kept out of
a run's events/s)."""
import numpy as np

from cmemu import kernels


def test_compiles_are_timed_and_told_once(monkeypatch):
    told = []
    monkeypatch.setattr(kernels._COMPILES, "told", False)
    monkeypatch.setattr(kernels._COMPILES, "tell", lambda: told.append(1))

    @kernels.njit(cache=False)
    def inner(x):
        return x * 2

    @kernels.njit(cache=False)
    def outer(a):
        s = 0
        for v in a:
            s += inner(v)
        return s

    before = kernels.compile_seconds()
    assert outer(np.arange(4)) == 12  # compiles outer, and inner within it
    after = kernels.compile_seconds()
    assert after > before and told == [1]
    assert outer(np.arange(5)) == 20  # compiled already: no time, no word
    assert kernels.compile_seconds() == after and told == [1]
    assert outer(np.arange(3.0)) == 6.0  # a new signature compiles, but is not told again
    assert kernels.compile_seconds() > after and told == [1]
    assert kernels._COMPILES.depth == 0
