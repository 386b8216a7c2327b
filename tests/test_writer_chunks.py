"""The timeline writer's orders and sums (results.columns, against numpy's lexsort and add.at) and
its chunks, compressed in threads and written as they are (output.hdf5), read back by h5py."""
import h5py
import numpy as np
import pytest

from cmemu.results.columns import has_repeats, increasing, lexsort_order, sum_by


def test_lexsort_order_is_np_lexsort():
    rng = np.random.default_rng(5)
    for n in (0, 1, 2, 50, 3000):
        a = rng.integers(0, 7, n).astype(np.int8)
        b = np.sort(rng.integers(-5, 40, n)).astype(np.int32)  # already in order: no pass
        c = rng.integers(0, 1000, n)
        wide = rng.integers(0, 2**40, n)  # too wide a range: np.lexsort
        for keys in ((a,), (a, c), (b, a), (a, b, c), (c, wide), (b,)):
            got = lexsort_order(keys)
            assert got.dtype == np.intp
            np.testing.assert_array_equal(got, np.lexsort(keys))


def test_has_repeats_in_an_order():
    rng = np.random.default_rng(8)
    for n in (0, 1, 2, 100, 1000):
        a, b = rng.integers(0, 20, n).astype(np.int32), rng.integers(0, 20, n).astype(np.int32)
        order = np.lexsort((b, a))
        want = bool(np.any((a[order][1:] == a[order][:-1]) & (b[order][1:] == b[order][:-1])))
        assert has_repeats(order, a, b) == want
    assert has_repeats([0, 1], [3, 3], [5, 5]) and not has_repeats([0, 1], [3, 3], [5, 6])


def test_increasing_means_sorted_without_repeats():
    assert increasing([], []) and increasing([4], [9])
    assert increasing([0, 0, 1, 3], [5, 7, 0, 0])
    assert not increasing([0, 0], [5, 5])  # a pair twice
    assert not increasing([0, 1, 0], [1, 2, 3]) and not increasing([2, 2], [1, 0])
    rng = np.random.default_rng(9)
    a, b = rng.integers(0, 5, 200), rng.integers(0, 5, 200)
    key = a * 5 + b
    assert not increasing(a, b)
    uniq = np.unique(key)
    assert increasing(uniq // 5, uniq % 5)


def test_sum_by_is_add_at():
    rng = np.random.default_rng(6)
    idx = rng.integers(0, 50, 10_000).astype(np.int32)
    val = rng.integers(-2**40, 2**60, 10_000)  # large: float weights would round
    want = np.zeros(50, dtype=np.int64)
    np.add.at(want, idx, val)
    np.testing.assert_array_equal(sum_by(idx, val, 50), want)
    with pytest.raises(IndexError):
        sum_by(idx, val, 10)


@pytest.mark.parametrize("compression", ["gzip", "gzip-zlib", "lzf", "none"])
def test_writer_chunks_read_back(tmp_path, compression, monkeypatch):
    import zlib

    import cmemu.output.hdf5 as H

    if compression == "gzip-zlib":  # where ISA-L is not installed: zlib's own deflate
        monkeypatch.setattr(H, "_deflate", zlib)
        compression = "gzip"
    else:
        assert H.DEFLATE == "isal"  # a dependency: the fast path is the one tested
    monkeypatch.setattr(H, "CHUNK_ROWS", 1000)
    monkeypatch.setattr(H, "PENDING_CHUNKS", 3)  # chunks of several datasets in the works at once
    rng = np.random.default_rng(7)
    cols = {f"n{n}": rng.integers(-2**62, 2**62, n) for n in (0, 1, 999, 1000, 1001, 4321)}
    cols["u8"] = rng.integers(0, 8, 2500).astype(np.uint8)
    cols["i32"] = rng.integers(-2**31, 2**31, 2500).astype(np.int32)
    cols["two_d"] = rng.integers(0, 10**12, (1500, 6))
    order = rng.permutation(2500)
    w = H._Writer(compression)
    try:
        with h5py.File(tmp_path / "t.h5", "w") as f:
            for name, c in cols.items():
                w.dataset(f, name, c, doc="x")
            w.dataset(f, "ordered", cols["i32"], order=order)
            w.dataset(f, "enum", cols["u8"], dtype=H.PIPE_ENUM)
            w.dataset(f, "names", [f"op{i}" for i in range(2100)])
            w.flush()
    finally:
        w.close()
    with h5py.File(tmp_path / "t.h5", "r") as f:
        for name, c in cols.items():
            ds = f[name]
            assert ds.dtype == c.dtype and ds.attrs["doc"] == "x"
            np.testing.assert_array_equal(ds[()], c)
            if compression == "gzip":
                assert ds.compression == "gzip" and ds.compression_opts == H.GZIP_LEVEL and ds.shuffle
        np.testing.assert_array_equal(f["ordered"][()], cols["i32"][order])
        np.testing.assert_array_equal(f["enum"][()], cols["u8"])
        assert h5py.check_enum_dtype(f["enum"].dtype) is not None
        assert [x.decode() for x in f["names"][()]] == [f"op{i}" for i in range(2100)]
