"""`cmemu report`'s HBM utilisation: per die from /dies/hbm_binned (every op's HBM bytes, COMP
operands included) over makespan x the die's capacity (the achieved sequential read rate the
engine shares), the busiest stack from /dies/hbm_stack_binned, and the fallbacks of older files."""
import dataclasses
import shutil

import h5py
import numpy as np
import pytest

from cmemu.lower import hbm_capacity_byte_per_s
from cmemu.output import hdf5
from cmemu.output.reader import HBM_SOURCE_BINNED, HBM_SOURCE_MEM_OPS, open_timeline
from cmemu.output.report import run_report
from cmemu.output.summary import HBM_CAPACITY_ACHIEVED, HBM_CAPACITY_NOMINAL, hbm_figures
from cmemu.run import run_trace
from conftest import TRACES
from test_timeline import TINY, TINY_V1


@pytest.fixture(scope="module")
def decode(tmp_path_factory):
    path = tmp_path_factory.mktemp("hbm") / "decode.h5"
    result = run_trace(TRACES / "deepseek_r1_decode_mini_2layers.json", output=path, progress=False)
    return path, result


def test_hbm_utilisation_comes_from_the_binned_bytes_and_the_die_capacity(decode):
    path, r = decode
    cap = hbm_capacity_byte_per_s(r.spec.die)
    with open_timeline(path) as t:
        h = t.summary()["hbm"]
        c = t.columns("dies/hbm_binned")
        sc = t.columns("dies/hbm_stack_binned")
        end = t.sim_end_ps
    assert h["source"] == HBM_SOURCE_BINNED and h["capacity"] == HBM_CAPACITY_ACHIEVED and h["note"] is None
    assert h["capacity_gbyte_per_s"] == pytest.approx(cap / 1e9)
    per_die = np.bincount(c["die"], weights=c["bytes"], minlength=r.spec.dies)
    assert h["bytes"] == int(per_die.sum()) > 0  # the COMP ops' operands: the MEM op bytes are 0 here
    util = per_die / (cap * end / 1e12)
    assert h["utilisation_per_die_max_percent"] == pytest.approx(100 * util.max())
    assert h["die_max"] == int(util.argmax())
    assert 0 < h["utilisation_per_die_mean_percent"] <= 100
    b = h["busiest_stack"]
    stacks = r.spec.die.hbm_stacks
    per_stack = np.bincount(sc["die"].astype(np.int64) * stacks + sc["stack"], weights=sc["bytes"])
    assert b["bytes"] == int(per_stack.max()) and b["stacks_per_die"] == stacks
    assert b["utilisation_percent"] == pytest.approx(100 * per_stack.max() / (cap / stacks * end / 1e12))


def test_report_text_names_the_capacity_and_the_busiest_stack(decode, tmp_path):
    path, _ = decode
    lines = []
    written = run_report(path, plots_dir=tmp_path / "p", echo=lines.append)
    text = "\n".join(lines)
    assert "achieved sequential read rate" in text and "nominal 1,600 GB/s" in text
    assert "busiest stack: die" in text and "hbm_binned" in text
    assert "hbm.png" in [p.name for p in written]


def test_without_hbm_bins_the_mem_op_bytes_with_a_note(tmp_path):
    r = dataclasses.replace(run_trace(TINY, progress=False), hbm_series=None, hbm_stack_series=None)
    path = hdf5.write_timeline(tmp_path / "tiny.h5", r)
    with open_timeline(path) as t:
        h = t.summary()["hbm"]
        d = t.dies_columns()
    assert h["source"] == HBM_SOURCE_MEM_OPS and "--link-bin-ns 0" in h["note"]
    assert h["bytes"] == int((d["hbm_read_bytes"] + d["hbm_write_bytes"]).sum())
    assert h["busiest_stack"] is None
    lines = []
    run_report(path, echo=lines.append)
    assert "note: the run binned no counters" in "\n".join(lines)


def test_a_file_without_stack_bins_has_no_busiest_stack(decode, tmp_path):
    path, _ = decode
    v3 = tmp_path / "nostack.h5"
    shutil.copy(path, v3)
    with h5py.File(v3, "a") as f:
        del f["dies/hbm_stack_binned"]
    with open_timeline(v3) as t:
        h = t.summary()["hbm"]
    assert h["source"] == HBM_SOURCE_BINNED and h["busiest_stack"] is None and "hbm_stack_binned" in h["note"]


def test_v1_file_and_an_unknown_die_spec_fall_back(tmp_path):
    with open_timeline(TINY_V1) as t:
        h = t.summary()["hbm"]
    assert h["source"] == HBM_SOURCE_MEM_OPS and "layout version 1" in h["note"]
    # A spec whose die fields this cmemu does not know: the nominal bandwidth, and it says so.
    with open_timeline(TINY_V1) as t:
        t.spec["die"]["some_future_field"] = 1
        h = t.summary()["hbm"]
    assert h["capacity"] == HBM_CAPACITY_NOMINAL
    assert h["capacity_gbyte_per_s"] == pytest.approx(float(t.spec["die"]["hbm_bandwidth_gbyte_per_s"]))


def test_hbm_figures_by_hand():
    # Two dies, 1 us makespan, 1000 GB/s: die 0 moved 500 kB (50%), die 1 100 kB; 2 stacks each.
    h = hbm_figures([500_000, 100_000], 1_000_000, 1e12, [True, True],
                    stacks=([0, 0, 1], [0, 1, 1], [400_000, 100_000, 100_000], 2),
                    bins=([0, 1], [0, 0], [500_000, 100_000], 1_000_000))
    assert h["utilisation_per_die_max_percent"] == pytest.approx(50) and h["die_max"] == 0
    assert h["utilisation_per_die_mean_percent"] == pytest.approx(30)
    s = h["busiest_stack"]
    assert (s["die"], s["stack"], s["bytes"]) == (0, 0, 400_000)
    assert s["utilisation_percent"] == pytest.approx(80)  # of its 500 GB/s share
    assert s["share_of_die_bytes_percent"] == pytest.approx(80)
    assert h["busiest_bin"]["gbyte_per_s"] == pytest.approx(500)
