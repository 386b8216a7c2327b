"""The HBM time series are spread a group of dies at a time (cmemu.results.hbm.hbm_series): the same series
whatever the grouping, since a die's cells depend on its own ops only."""
import numpy as np

import cmemu.results.hbm
import cmemu.run as R


def test_grouped_spread_is_the_same(monkeypatch):
    trace = "traces/deepseek_r1_decode_mini_2layers.json"
    whole = R.run_trace(trace, progress=False)
    monkeypatch.setattr(cmemu.results.hbm, "HBM_SPREAD_INTERVALS", 1000)  # many groups of dies
    grouped = R.run_trace(trace, progress=False)
    for a, b in ((whole.hbm_series, grouped.hbm_series), (whole.hbm_stack_series, grouped.hbm_stack_series)):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k
            if isinstance(a[k], np.ndarray):
                assert a[k].dtype == b[k].dtype, k
    assert whole.hbm_series["bytes"].sum() > 0
