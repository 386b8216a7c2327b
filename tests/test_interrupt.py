"""Interrupted runs (DESIGN.md, "Bad input"): Ctrl-C stops `cmemu run` with one line and exit
status 130 and leaves no file at the output path and no temporary file; SIGKILL leaves at most the
hidden temporary file beside the target. The signal tests run the real command on a trace big
enough to still be running after a second or two; the in-process tests place the interrupt
exactly (between engine slices, in the middle of writing the timeline).
"""
from __future__ import annotations

import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from cmemu.cli import main

INTERRUPTED = "cmemu: interrupted; no output written"


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory):
    """All 768 dies of cloudmatrix384 each send 64 messages of 256 KiB to random dies: several
    seconds of engine time on the development machine, of which a test waits at most two."""
    rnd = random.Random(8)
    dies, nodes = 768, []
    for k in range(64):
        for a in range(dies):
            b = (a + 1 + rnd.randrange(dies - 1)) % dies
            nodes.append({"id": len(nodes), "type": "COMM_SEND", "rank": a,
                          "attrs": {"comm_dst": b, "comm_size": 256 * 1024, "comm_tag": k}})
            nodes.append({"id": len(nodes), "type": "COMM_RECV", "rank": b, "stream": 1 + k % 4,
                          "attrs": {"comm_src": a, "comm_size": 256 * 1024, "comm_tag": k}})
    path = tmp_path_factory.mktemp("big") / "big.json"
    path.write_text(json.dumps({"schema": "cmemu.trace", "version": 1, "time_unit": "ns",
                                "system": "cloudmatrix384", "nodes": nodes}))
    return path


def _start(trace, out):
    return subprocess.Popen([sys.executable, "-m", "cmemu.cli", "run", str(trace), "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=out.parent)


def _wait_for_progress(proc, timeout_s=60.0):
    """Read stderr until the progress line shows: the engine is running its slices."""
    fd = proc.stderr.fileno()
    seen, t0 = b"", time.monotonic()
    while b"simulated" not in seen:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() - t0 < timeout_s, "no progress line"
        if select.select([fd], [], [], 0.1)[0]:
            seen += os.read(fd, 1 << 16)
    return seen.decode()


def _assert_interrupted_cleanly(proc, out, before=""):
    stdout, stderr = proc.communicate(timeout=30)  # one slice of events at most, then the exit
    stdout, stderr = stdout.decode(), before + stderr.decode()
    assert proc.returncode == 130, (proc.returncode, stderr)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    last = stderr.rstrip("\n").split("\n")[-1]
    assert last == INTERRUPTED, stderr
    assert stdout == ""
    assert not out.exists()
    assert sorted(os.listdir(out.parent)) == [], "a file was left beside the target"


def test_sigint_after_a_second(big_trace, tmp_path):
    # Wherever the run is after a second (reading, lowering or simulating), Ctrl-C ends it cleanly.
    out = tmp_path / "out" / "big.h5"
    out.parent.mkdir()
    proc = _start(big_trace, out)
    time.sleep(1.0)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _assert_interrupted_cleanly(proc, out)


def test_sigint_while_the_engine_runs(big_trace, tmp_path):
    # Once the progress line shows, the interrupt lands between two slices of the engine.
    out = tmp_path / "out" / "big.h5"
    out.parent.mkdir()
    proc = _start(big_trace, out)
    seen = _wait_for_progress(proc)
    proc.send_signal(signal.SIGINT)
    _assert_interrupted_cleanly(proc, out, before=seen)


def test_sigkill_leaves_at_most_a_temporary_file(big_trace, tmp_path):
    out = tmp_path / "out" / "big.h5"
    out.parent.mkdir()
    proc = _start(big_trace, out)
    time.sleep(1.5)
    proc.kill()
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    for name in os.listdir(out.parent):
        assert re.fullmatch(r"\.big\.h5\.tmp-[0-9a-f]{16}", name), name


def _tiny_trace(tmp_path):
    nodes = []
    for k in range(40):
        nodes.append({"id": 2 * k, "type": "COMM_SEND", "rank": k % 32,
                      "attrs": {"comm_dst": (k + 5) % 32, "comm_size": 20_000, "comm_tag": k}})
        nodes.append({"id": 2 * k + 1, "type": "COMM_RECV", "rank": (k + 5) % 32,
                      "attrs": {"comm_src": k % 32, "comm_size": 20_000, "comm_tag": k}})
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"schema": "cmemu.trace", "version": 1, "time_unit": "ns",
                                "system": "mini", "nodes": nodes}))
    return path


def test_interrupt_between_engine_slices_in_process(tmp_path, monkeypatch):
    import cmemu.run

    slices = []

    def interrupted(self, engine):
        slices.append(engine.events)
        if len(slices) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(cmemu.run, "EVENTS_PER_SLICE", 100)
    monkeypatch.setattr(cmemu.run.Progress, "update", interrupted)
    out = tmp_path / "out" / "tiny.h5"
    out.parent.mkdir()
    result = CliRunner().invoke(main, ["run", str(_tiny_trace(tmp_path)), "-o", str(out)])
    assert result.exit_code == 130, (result.output, result.exception)
    assert result.stderr.splitlines() == [INTERRUPTED]
    assert len(slices) == 3 and slices[0] < slices[2]  # it was interrupted mid-run
    assert not out.exists() and os.listdir(out.parent) == []


def test_interrupt_while_writing_the_timeline_in_process(tmp_path, monkeypatch):
    import cmemu.output.hdf5 as hdf5

    real_write = hdf5._write
    calls = []

    def write_then_interrupt(f, *args, **kwargs):
        real_write(f, *args, **kwargs)  # the temporary file now holds (nearly) everything
        calls.append(f.filename)
        raise KeyboardInterrupt

    monkeypatch.setattr(hdf5, "_write", write_then_interrupt)
    out = tmp_path / "out" / "tiny.h5"
    out.parent.mkdir()
    result = CliRunner().invoke(main, ["run", str(_tiny_trace(tmp_path)), "-o", str(out), "--quiet"])
    assert result.exit_code == 130, (result.output, result.exception)
    assert result.stderr.splitlines() == [INTERRUPTED]
    assert calls and os.path.basename(calls[0]).startswith(".tiny.h5.tmp-")
    assert not out.exists() and os.listdir(out.parent) == []
