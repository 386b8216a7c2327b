"""The HBM model: DRAM timings by hand, refresh, turnaround, and bandwidth that never exceeds
what the pins can carry (docs/machine.md 2.3; timings of [DS3])."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cmemu.die.hbm import T_BURST, HBMParams, access_latency_ps, map_granules, pc_schedule, stream
from cmemu.spec import load_system


@pytest.fixture(scope="module")
def die():
    return load_system("mini").die


@pytest.fixture(scope="module")
def hp(die):
    return HBMParams.from_die(die)


def ps(ns):
    return round(ns * 1000)


def test_organisation_and_peak(die, hp):
    # 4 stacks x 8 channels x 2 pseudo-channels; 64-bit PCs, burst of 4 beats = 32 B in 1.25 ns.
    assert hp.pseudo_channels == 64 and hp.burst_byte == 32 and hp.timing[T_BURST] == 1250
    assert hp.pc_peak_byte_per_s * hp.pseudo_channels == pytest.approx(die.hbm_pin_peak_byte_per_s)
    assert die.hbm_pin_peak_byte_per_s == pytest.approx(1638.4e9)


def test_row_miss_then_hit_by_hand(die, hp):
    # Two 512 B reads in one row of one bank: ACT at 0, first column after tRCD, data after CL,
    # 16 bursts each, back to back on the bus (the second is a row hit).
    bank = np.array([0, 0]); row = np.array([5, 5])
    done, hits, _ = pc_schedule(bank, row, np.zeros(2, np.uint8), np.array([16, 16]), np.zeros(2, np.int64),
                                hp.timing_array())
    first = ps(die.hbm_trcd_ns) + ps(die.hbm_tcl_ns) + 16 * 1250
    assert list(done) == [first, first + 16 * 1250] and hits == 1


def test_row_conflict_by_hand(die, hp):
    # Same bank, another row: PRE waits for tRAS (and tRTP after the last read), then tRP, ACT,
    # tRCD, CL.
    bank = np.array([0, 0]); row = np.array([1, 2])
    done, hits, _ = pc_schedule(bank, row, np.zeros(2, np.uint8), np.array([1, 1]), np.zeros(2, np.int64),
                                hp.timing_array())
    pre = max(ps(die.hbm_tras_ns), ps(die.hbm_trcd_ns) + ps(die.hbm_trtp_ns))
    assert hits == 0
    assert done[1] == pre + ps(die.hbm_trp_ns) + ps(die.hbm_trcd_ns) + ps(die.hbm_tcl_ns) + 1250


def test_one_burst_latency_is_the_cyc_latency(die, hp):
    # [CYC]'s 347 / 203 cycles are what a core sees for one burst on an idle HBM.
    assert access_latency_ps(hp, 32) == round(die.hbm_read_latency_cycles * 1e6 / die.ai_core_clock_mhz)
    assert access_latency_ps(hp, 32, write=True) == round(die.hbm_write_latency_cycles * 1e6 / die.ai_core_clock_mhz)
    # A larger access adds its busiest pseudo-channel's bursts, back to back (the other banks'
    # activations hide behind the data): 1 MiB = 2048 granules of 16 bursts over 64 PCs.
    assert access_latency_ps(hp, 1 << 20) == access_latency_ps(hp, 512) + (2048 // 64 - 1) * 16 * 1250


def test_refresh_is_visible_in_a_long_stream(die, hp):
    # A sequential read stream on PC 0 for ~40 us: the bus stalls once per tREFI for tRFC.
    g = np.arange(0, 64 * 4000, 64)  # granules of PC 0
    pc, bank, row = map_granules(hp, g)
    assert (pc == 0).all()
    n = len(g)
    done, _, refreshes = pc_schedule(bank, row, np.zeros(n, np.uint8), np.full(n, 16), np.zeros(n, np.int64),
                                     hp.timing_array())
    gaps = np.diff(done)
    big = gaps[gaps > ps(die.hbm_trfc_ns)]
    assert refreshes == int(done[-1] // ps(die.hbm_trefi_ns))
    assert len(big) == refreshes  # each refresh shows as one gap of at least tRFC
    # Without refresh (tREFI far beyond the run) the same stream is faster by about tRFC/tREFI.
    no_ref = HBMParams.from_die(load_system("mini", ["die.hbm_trefi_ns=1e9"]).die)
    done2, _, r2 = pc_schedule(bank, row, np.zeros(n, np.uint8), np.full(n, 16), np.zeros(n, np.int64),
                               no_ref.timing_array())
    assert r2 == 0
    loss = 1 - done2[-1] / done[-1]
    assert loss == pytest.approx(die.hbm_trfc_ns / die.hbm_trefi_ns, rel=0.15)


def test_turnaround_costs_bandwidth(hp):
    # Reads and writes interleaved one by one turn the bus around every request.
    n = 400
    g = np.arange(0, 64 * n, 64)
    _, bank, row = map_granules(hp, g)
    args = (bank, row)
    same = pc_schedule(*args, np.zeros(n, np.uint8), np.full(n, 4), np.zeros(n, np.int64), hp.timing_array())[0]
    mixed = pc_schedule(*args, (np.arange(n) % 2).astype(np.uint8), np.full(n, 4), np.zeros(n, np.int64),
                        hp.timing_array())[0]
    assert mixed[-1] > 1.2 * same[-1]


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["read", "write", "copy"]), size=st.sampled_from([32, 64, 96, 512, 3000, 65536]),
       pattern=st.sampled_from(["sequential", "random"]), seed=st.integers(0, 5))
def test_bandwidth_never_above_the_pins(hp, kind, size, pattern, seed):
    r = stream(hp, kind, size, pattern, window_ns=4000.0, seed=seed)
    assert 0 < r.bandwidth_byte_per_s <= hp.pin_peak_byte_per_s


def test_small_random_accesses_are_bounded_by_tfaw(die, hp):
    # One 32 B access per activation: at most 4 activations per tFAW per pseudo-channel.
    r = stream(hp, "read", 32, "random")
    bound = 4 * 32 / (die.hbm_tfaw_ns * 1e-9) * hp.pseudo_channels
    assert r.bandwidth_byte_per_s <= bound * 1.001
    # Larger accesses amortise each activation over more bursts.
    rates = [stream(hp, "read", s, "random").bandwidth_byte_per_s for s in (32, 64, 128, 256, 512)]
    assert rates == sorted(rates)


def test_pc_schedule_native_matches_reference(hp):
    rng = np.random.default_rng(3)
    n = 3000
    args = (rng.integers(0, 16, n), rng.integers(0, 8, n), rng.integers(0, 2, n).astype(np.uint8),
            rng.integers(1, 17, n), np.sort(rng.integers(0, 2_000_000, n)))
    a = pc_schedule(*args, hp.timing_array())
    b = pc_schedule.py_func(*args, hp.timing_array())
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1:] == b[1:]
