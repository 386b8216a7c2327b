"""Interrupted commands (docs/architecture.md, "Bad input"): Ctrl-C stops `cmemu run` with one line and exit
status 130, SIGTERM (kill, timeout, batch schedulers) with one line and 143, and neither leaves a
file at the output path or a temporary file; SIGKILL leaves at most the hidden temporary file
beside the target. The same holds for `export perfetto`, `trace gen` and `report --plots` (whose
PNGs are renamed into place all together, or none), and a Ctrl-C to a sweep's whole process
group (its Dask workers included) prints one line too.

The signal tests run the real command on a trace big enough to still be running after a second
or two; the in-process tests place the interrupt exactly (between engine slices, in the middle
of writing an output), most with a real signal this process sends itself.
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
    """All 768 dies of cloudmatrix384 each send 128 messages of 256 KiB to random dies: several
    seconds of engine time on the development machine, of which a test waits at most two."""
    rnd = random.Random(8)
    dies, nodes = 768, []
    for k in range(128):
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


def _tiny_run_ends_in(tmp_path, code, line, calls):
    """`cmemu run` of the tiny trace, in process, where an interrupt was placed (``calls``: the
    calls it was placed in): the one line, the exit status ``code``, and no file left."""
    out = tmp_path / "out" / "tiny.h5"
    out.parent.mkdir()
    result = CliRunner().invoke(main, ["run", str(_tiny_trace(tmp_path)), "-o", str(out), "--quiet"])
    assert result.exit_code == code, (result.output, result.exception)
    assert result.stderr.splitlines() == [line] and calls
    assert os.listdir(out.parent) == []


def test_interrupt_between_engine_slices_in_process(tmp_path, monkeypatch):
    import cmemu.run.pipeline
    import cmemu.run.progress

    slices = []

    def interrupted(self, engine):
        slices.append(engine.events)
        if len(slices) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(cmemu.run.pipeline, "EVENTS_PER_SLICE", 100)
    monkeypatch.setattr(cmemu.run.progress.Progress, "update", interrupted)
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


class _SignalInDestructor:
    """Sends this process a signal as it is collected: Python runs the handler in the destructor,
    where the exception it raises is only printed ("Exception ignored in ..."), never raised."""

    def __init__(self, signum):
        self.signum = signum

    def __del__(self):
        os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, "cmemu: interrupted; no output written"),
                                                (signal.SIGTERM, 143, "cmemu: terminated; no output written")])
def test_a_signal_lost_in_a_destructor_still_stops_the_run(signum, code, line, tmp_path, monkeypatch):
    # Ctrl-C or SIGTERM while Python runs a destructor: its KeyboardInterrupt is lost there, and
    # the run would go on to write its timeline and exit 0. The CLI's handlers latch it: no file
    # is renamed into place, and the run ends as interrupted.
    import cmemu.run.pipeline

    real = cmemu.run.pipeline.check_invariants

    def lose_a_signal(*args, **kwargs):
        _SignalInDestructor(signum)  # collected at once: the handler runs inside __del__
        return real(*args, **kwargs)

    lost = []
    monkeypatch.setattr(cmemu.run.pipeline, "check_invariants", lose_a_signal)
    monkeypatch.setattr(sys, "unraisablehook", lambda u: lost.append(u.exc_type))
    out = tmp_path / "out" / "tiny.h5"
    out.parent.mkdir()
    result = CliRunner().invoke(main, ["run", str(_tiny_trace(tmp_path)), "-o", str(out), "--quiet"])
    assert result.exit_code == code, (result.output, result.exception)
    assert lost and issubclass(lost[0], KeyboardInterrupt)  # it was lost in the destructor
    assert result.stderr.splitlines() == [line]
    assert not out.exists() and os.listdir(out.parent) == []
    # The latch is the command's: a library call after it writes its file.
    from cmemu.run import run_trace

    monkeypatch.undo()  # (no signal lost this time: a SIGTERM outside the CLI would end pytest)
    run_trace(_tiny_trace(tmp_path), output=out, progress=False)
    assert out.exists()


# -- SIGTERM, and the other commands that write a file --------------------------------------------

TERMINATED = "cmemu: terminated; no output written"


def test_sigterm_while_the_engine_runs(big_trace, tmp_path):
    out = tmp_path / "out" / "big.h5"
    out.parent.mkdir()
    proc = _start(big_trace, out)
    seen = _wait_for_progress(proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    stderr = seen + stderr.decode()
    assert proc.returncode == 143, (proc.returncode, stderr)
    assert "Traceback" not in stderr
    assert stderr.rstrip("\n").split("\n")[-1] == TERMINATED, stderr
    assert os.listdir(out.parent) == []


def _signal_on_call(monkeypatch, module, name, signum, at_call=1):
    """Replace ``module.name`` by a wrapper that sends this process ``signum`` on its
    ``at_call``-th call (Python then raises KeyboardInterrupt, or Terminated under the CLI's
    SIGTERM handler, at the next instruction); returns the list of calls so far."""
    real = getattr(module, name)
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            os.kill(os.getpid(), signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


@pytest.fixture(scope="module")
def timeline(tmp_path_factory):
    path = tmp_path_factory.mktemp("timeline") / "tiny.h5"
    result = CliRunner().invoke(main, ["run", str(_tiny_trace(path.parent)), "-o", str(path), "--quiet"])
    assert result.exit_code == 0, result.output
    return path


@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, INTERRUPTED),
                                                (signal.SIGTERM, 143, TERMINATED)])
def test_signal_while_writing_the_timeline(signum, code, line, tmp_path, monkeypatch):
    import cmemu.output.hdf5 as hdf5

    calls = _signal_on_call(monkeypatch, hdf5, "_write_hbm", signum)  # the last group written
    _tiny_run_ends_in(tmp_path, code, line, calls)


@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, INTERRUPTED),
                                                (signal.SIGTERM, 143, TERMINATED)])
def test_signal_while_exporting(signum, code, line, timeline, tmp_path, monkeypatch):
    import cmemu.output.perfetto as perfetto

    monkeypatch.setattr(perfetto, "_WRITE_ROWS", 16)  # many chunks: the signal lands mid-file
    calls = _signal_on_call(monkeypatch, perfetto, "_us", signum, at_call=4)
    out = tmp_path / "out" / "tiny.json.gz"
    out.parent.mkdir()
    result = CliRunner().invoke(main, ["export", "perfetto", str(timeline), "-o", str(out)])
    assert result.exit_code == code, (result.output, result.exception)
    assert result.stderr.splitlines() == [line] and len(calls) == 4
    assert os.listdir(out.parent) == []


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, INTERRUPTED),
                                                (signal.SIGTERM, 143, TERMINATED)])
def test_signal_while_trace_gen_writes(signum, code, line, suffix, tmp_path, monkeypatch):
    # Before, an interrupt here left a hidden .NAME.tmp as big as the trace.
    calls = _signal_on_call(monkeypatch, json, "dumps", signum, at_call=500)  # one call per node
    out = tmp_path / "out" / f"step{suffix}"
    out.parent.mkdir()
    result = CliRunner().invoke(main, ["trace", "gen", "deepseek-r1", "--system", "mini", "--layers", "1",
                                       "-o", str(out)])
    assert result.exit_code == code, (result.output, result.exception)
    assert result.stderr.splitlines() == [line] and len(calls) >= 500
    assert os.listdir(out.parent) == []


def test_interrupt_while_plotting_writes_no_plot(timeline, tmp_path, monkeypatch):
    # Before, the PNGs drawn so far stayed (one of them truncated) under "no output written".
    import cmemu.output.report as report

    _signal_on_call(monkeypatch, report, "_op_types", signal.SIGINT)  # the third of the plots
    plots = tmp_path / "p"
    result = CliRunner().invoke(main, ["report", str(timeline), "--plots", str(plots)])
    assert result.exit_code == 130, (result.output, result.exception)
    assert result.stderr.splitlines() == [INTERRUPTED]
    assert os.listdir(plots) == []


def test_interrupt_while_the_plots_are_renamed_names_them_all(timeline, tmp_path, monkeypatch):
    # The renames are held together: an interrupt during them lands after the last, and the
    # line says what was written.
    import cmemu.output.atomic as atomic

    _signal_on_call(monkeypatch, atomic.os, "replace", signal.SIGINT)
    plots = tmp_path / "p"
    result = CliRunner().invoke(main, ["report", str(timeline), "--plots", str(plots)])
    monkeypatch.undo()
    assert result.exit_code == 130, (result.output, result.exception)
    names = sorted(os.listdir(plots))
    assert names == ["gantt.png", "hbm.png", "links.png", "op_types.png"]
    written = ", ".join(str(plots / n) for n in ("gantt.png", "links.png", "op_types.png", "hbm.png"))
    assert result.stderr.splitlines() == [f"cmemu: interrupted; wrote {written} before it"]


# -- sweeps: a Ctrl-C to the whole process group --------------------------------------------------

SWEEP = """\
scenario = "ub-p2p"
system = "mini"
[options]
sizes = "512"
a2a_dies = 0
op = "write"
[grid]
ub.link_rate_gbit_per_s = [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111]
"""


def _sweep_signalled(tmp_path, signum, group: bool, when):
    """Start `cmemu sweep` in a session of its own (its own process group, as a shell runs a
    command), wait for ``when(out)``, send ``signum`` to the group (a Ctrl-C at the terminal)
    or to the command alone; returns (exit status, stderr, out folder)."""
    sweep = tmp_path / "s.toml"
    sweep.write_text(SWEEP)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "cmemu.cli", "sweep", str(sweep), "-o", str(out),
                             "--workers", "2", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path, start_new_session=True)
    try:
        t0 = time.monotonic()
        while not when(out):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 120
            time.sleep(0.05)
        (os.killpg if group else os.kill)(proc.pid, signum)
        _stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, stderr.decode(), out


def _points_done(out):
    return any((out / "points").glob("*/results.json")) if (out / "points").is_dir() else False


KEPT = "finished points are kept in {out}, and a re-run skips them"


@pytest.mark.parametrize("moment", ["as the workers start", "while points run"])
def test_ctrl_c_to_a_sweeps_process_group_prints_one_line(moment, tmp_path):
    # Before, the workers took the SIGINT as their own, and each logged dozens of lines of
    # tracebacks before cmemu's line (while they started, as they imported Dask).
    when = (lambda out: (out / "points").is_dir()) if moment == "as the workers start" else _points_done
    code, stderr, out = _sweep_signalled(tmp_path, signal.SIGINT, True, when)
    assert code == 130, stderr
    assert stderr.splitlines() == ["cmemu: interrupted; " + KEPT.format(out=out)], stderr


def test_sigterm_to_a_sweep_prints_one_line(tmp_path):
    code, stderr, out = _sweep_signalled(tmp_path, signal.SIGTERM, False, _points_done)
    assert code == 143, stderr
    assert stderr.splitlines() == ["cmemu: terminated; " + KEPT.format(out=out)], stderr
    assert not [p for p in out.rglob(".*")], "a temporary file was left"


# -- where CPython or click would take the interrupt for their own ---------------------------------

DRIVER = """\
import os, signal, sys

import cmemu.run.pipeline
from cmemu.cli import main

real = cmemu.run.pipeline.check_invariants


def interrupt_in_a_string_exec(*args, **kwargs):
    # As dataclasses and namedtuple do while a module imports: the handler runs in the exec'd code.
    exec("os.kill(os.getpid(), signal.SIG{sig})", {{"os": os, "signal": signal}})
    return real(*args, **kwargs)


cmemu.run.pipeline.check_invariants = interrupt_in_a_string_exec
main()
"""


@pytest.mark.parametrize("sig, code, line", [("INT", 130, INTERRUPTED), ("TERM", 143, TERMINATED)])
def test_an_interrupt_that_ends_a_string_exec_still_exits_130(sig, code, line, tmp_path):
    # Before, a Ctrl-C that landed in a string exec (a dataclass being made as `cmemu run` imports
    # the pipeline) printed the line and exit status 130 was set, but CPython had marked the
    # KeyboardInterrupt as unhandled, and `python -m` killed itself with SIGINT after the exit (-2).
    (tmp_path / "drive_cmemu.py").write_text(DRIVER.format(sig=sig))
    out = tmp_path / "out" / "tiny.h5"
    out.parent.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "drive_cmemu", "run", str(_tiny_trace(tmp_path)), "-o", str(out),
                           "--quiet"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert proc.stderr.splitlines() == [line]
    assert os.listdir(out.parent) == []


@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, INTERRUPTED),
                                                (signal.SIGTERM, 143, TERMINATED)])
def test_an_interrupt_before_the_command_runs_is_one_line(signum, code, line, tmp_path, monkeypatch):
    # Before, a Ctrl-C as the command line's group set itself up (outside the command's
    # reports_errors) was click's "Aborted!" and exit status 1; a SIGTERM there killed the process.
    import cmemu.kernels

    calls = _signal_on_call(monkeypatch, cmemu.kernels, "tell_compiles", signum)
    _tiny_run_ends_in(tmp_path, code, line, calls)


def test_an_interrupt_while_the_folder_is_probed_leaves_no_probe(tmp_path, monkeypatch):
    # Before, a Ctrl-C between the probe file's creation and its removal left it in the folder.
    import cmemu.output.atomic as atomic

    calls = _signal_on_call(monkeypatch, atomic.os, "close", signal.SIGINT)  # the probe's
    with pytest.raises(KeyboardInterrupt):
        atomic.check_output(tmp_path / "out.h5")
    monkeypatch.undo()
    assert calls and os.listdir(tmp_path) == []


@pytest.mark.parametrize("name, at_call", [("open", 2), ("fdopen", 1)])  # os.open's first call is the probe's
def test_an_interrupt_as_a_temporary_file_is_opened_is_the_interrupt(name, at_call, tmp_path, monkeypatch):
    # Before, a Ctrl-C that landed after os.fdopen had made the file object and before the file
    # was in the list (in a sweep, as a point's results.json was written) dropped the object,
    # which closed the descriptor; closing it again raised EBADF over the interrupt, and the
    # sweep ended "cannot write .../results.json: Bad file descriptor; nothing written", exit
    # status 2. One after os.open and before the file was recorded left the temporary file.
    import cmemu.output.atomic as atomic

    real, calls = getattr(atomic.os, name), []

    def signal_after(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) != at_call:
            return out
        try:
            os.kill(os.getpid(), signal.SIGINT)  # Python raises the interrupt at the next instruction,
            return out  # unless it is held off until the file is recorded
        except KeyboardInterrupt:
            if name == "fdopen":  # as io.open does with the object it made: closed as it is dropped
                out.close()
            raise

    monkeypatch.setattr(atomic.os, name, signal_after)
    with pytest.raises(KeyboardInterrupt):
        with atomic.atomic_open(tmp_path / "results.json", "w", encoding="utf-8") as f:
            f.write("{}")
    monkeypatch.undo()
    assert len(calls) >= at_call and os.listdir(tmp_path) == []


@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, INTERRUPTED),
                                                (signal.SIGTERM, 143, TERMINATED)])
def test_a_signal_while_the_command_line_imports_is_one_line(signum, code, line):
    # The cmemu command (cmemu.__main__) puts its handler in place before it imports the command
    # line (about 0.1 s): a signal then ends it with the CLI's line and status, where Python's
    # own handler printed a traceback and the process died by SIGINT.
    script = ("import os, time, cmemu.__main__ as entry; entry._install(); "
              f"os.kill(os.getpid(), {int(signum)}); time.sleep(30)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert proc.stderr.splitlines() == [line]


def test_the_command_hands_the_signals_back_before_the_command_line_runs(monkeypatch):
    # Once the command line is imported, the handlers are those from before (the command line's
    # own take over as it starts: CommandLine), and `python -m cmemu` is the command line.
    import cmemu.__main__ as entry
    import cmemu.cli

    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    monkeypatch.setattr(cmemu.cli, "main", lambda: (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))
    assert entry.main() == before
    proc = subprocess.run([sys.executable, "-m", "cmemu", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "version" in proc.stdout
