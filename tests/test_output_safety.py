"""Output files against careless and hostile targets (cmemu.output.atomic): a link planted at a
temporary name is never written through; a link, device file or FIFO as the target is refused;
an output that is the input (the same file) is refused; a missing or read-only folder is refused
before the work; a full disk is one line and exit status 2 with no file left behind; any name a
command line can pass (hypothesis, over Unicode) is written whole or refused in one line. Every
command that writes a user-named file is tried: `run`, `export perfetto`, `trace gen`,
`report --plots`, `sweep`.

The commands run in-process (click's runner), so that a full disk or a read-only file system
can be stood in for by an OSError raised where the file is written (no root, no tiny file
system needed); the read-only folder made with chmod is skipped as root, which may write anyway.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import stat

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import cmemu.output.atomic as atomic
from cmemu.cli import main
from cmemu.output.atomic import OutputError, check_output
from conftest import TRACES

PINGPONG = TRACES / "examples" / "pingpong.json"
PRECIOUS = b"precious: not cmemu's to overwrite\n"
GEN = ["trace", "gen", "deepseek-r1", "--system", "mini", "--layers", "1"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(result, code=2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def timeline(tmp_path_factory):
    """A small timeline (pingpong on mini) to export and report on."""
    path = tmp_path_factory.mktemp("timeline") / "pp.h5"
    result = invoke("run", PINGPONG, "-o", path, "--quiet")
    assert result.exit_code == 0, result.output
    return path


def _copy(src, folder, name=None):
    dst = folder / (name or src.name)
    shutil.copyfile(src, dst)
    return dst


# The commands that write one file: (name, arguments given the output path).
def _commands(timeline, tmp_path):
    trace = _copy(PINGPONG, tmp_path, "t.json")
    return {
        "run": lambda out: ["run", trace, "-o", out, "--quiet"],
        "export": lambda out: ["export", "perfetto", timeline, "-o", out],
        "trace gen": lambda out: [*GEN, "-o", out],
    }


COMMANDS = ["run", "export", "trace gen"]


def _listing(folder):
    return sorted(os.listdir(folder))


# -- temporary files ------------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
def test_a_link_at_the_old_predictable_temporary_names_is_not_written_through(command, timeline, tmp_path):
    # Before, `run` and `export` wrote to .NAME.tmp-PID and `trace gen` to .NAME.tmp, opened in
    # a way that follows a link: a link planted there made cmemu overwrite the file it names.
    args = _commands(timeline, tmp_path)[command]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(PRECIOUS)
    out = out_dir / "o.json"
    planted = [out_dir / f".o.json.tmp-{os.getpid()}", out_dir / ".o.json.tmp"]
    for p in planted:
        p.symlink_to(victim)
    result = invoke(*args(out))
    assert result.exit_code == 0, (result.output, result.exception)
    assert victim.read_bytes() == PRECIOUS
    assert all(p.is_symlink() for p in planted)  # left as they were
    assert stat.S_ISREG(os.lstat(out).st_mode) and os.path.getsize(out) > 0
    assert _listing(out_dir) == sorted([out.name, *(p.name for p in planted)])


@pytest.mark.parametrize("command", COMMANDS)
def test_a_link_at_the_very_temporary_name_is_refused_and_left_alone(command, timeline, tmp_path, monkeypatch):
    # The name is random; should it be guessed all the same, the exclusive creation fails: one
    # line, nothing written through the link, the link left where it is.
    monkeypatch.setattr(atomic.secrets, "token_hex", lambda n: "ab" * n)
    args = _commands(timeline, tmp_path)[command]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(PRECIOUS)
    out = out_dir / "o.json"
    link = out_dir / f".o.json.tmp-{'ab' * 8}"
    link.symlink_to(victim)
    line = one_error_line(invoke(*args(out)))
    assert line.startswith(f"cmemu: error: cannot write {out}: a file appeared at the temporary name"), line
    assert victim.read_bytes() == PRECIOUS
    assert link.is_symlink() and _listing(out_dir) == [link.name]


def test_temporary_and_output_files_get_the_permissions_of_a_new_file(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic.atomic_open(tmp_path / "a.txt", "w") as f:
            f.write("x")
        with atomic.atomic_path(tmp_path / "b.h5") as tmp:
            import h5py

            with h5py.File(tmp, "x"):
                pass
    finally:
        os.umask(old)
    for name in ("a.txt", "b.h5"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o640, name
    assert _listing(tmp_path) == ["a.txt", "b.h5"]


# -- targets that are not regular files -----------------------------------------------------------

def _fifo(path):
    os.mkfifo(path)


def _char_device(path):
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device file here: {exc}")


def _link_to_a_file(path):
    victim = path.parent / "victim"
    victim.write_bytes(PRECIOUS)
    path.symlink_to(victim)


def _dangling_link(path):
    path.symlink_to(path.parent / "nowhere")


@pytest.mark.parametrize("make, kind", [(_fifo, "is a FIFO"), (_char_device, "is a character device"),
                                        (_link_to_a_file, "is a symbolic link"),
                                        (_dangling_link, "is a symbolic link")])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_target_that_is_not_a_regular_file_is_refused(command, make, kind, timeline, tmp_path):
    args = _commands(timeline, tmp_path)[command]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "target"
    make(out)
    before = os.lstat(out)
    line = one_error_line(invoke(*args(out)))
    assert line.startswith(f"cmemu: error: {out} {kind}"), line
    after = os.lstat(out)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    if (out_dir / "victim").exists():
        assert (out_dir / "victim").read_bytes() == PRECIOUS
    assert not [n for n in _listing(out_dir) if n.startswith(".")]


def test_a_folder_or_a_link_among_the_plots_is_refused(timeline, tmp_path):
    plots = tmp_path / "p"
    plots.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(PRECIOUS)
    (plots / "links.png").symlink_to(victim)
    line = one_error_line(invoke("report", timeline, "--plots", plots))
    assert "links.png is a symbolic link" in line
    assert victim.read_bytes() == PRECIOUS and _listing(plots) == ["links.png"]
    (plots / "links.png").unlink()
    (plots / "gantt.png").mkdir()
    line = one_error_line(invoke("report", timeline, "--plots", plots))
    assert "gantt.png is a folder" in line and _listing(plots) == ["gantt.png"]


def test_check_output_refuses_folders_and_names_without_a_file(tmp_path):
    with pytest.raises(OutputError, match="is a folder"):
        check_output(tmp_path)
    with pytest.raises(OutputError, match="name a file"):
        check_output(tmp_path / ".")


# -- the output is the input ---------------------------------------------------------------------

def test_run_refuses_to_write_over_its_trace(tmp_path):
    trace = _copy(PINGPONG, tmp_path, "t.json")
    original = trace.read_bytes()
    line = one_error_line(invoke("run", trace, "-o", trace))
    assert line == (f"cmemu: error: {trace} is the input; cmemu does not write over its input: "
                    "name another output file")
    os.link(trace, tmp_path / "same.h5")  # another name for the same file
    line = one_error_line(invoke("run", trace, "-o", tmp_path / "same.h5"))
    assert f"is the input {trace} under another name" in line
    assert trace.read_bytes() == original and _listing(tmp_path) == ["same.h5", "t.json"]


def test_export_and_report_refuse_to_write_over_the_timeline(timeline, tmp_path):
    copy = _copy(timeline, tmp_path, "a.h5")
    original = copy.read_bytes()
    line = one_error_line(invoke("export", "perfetto", copy, "-o", copy))
    assert "is the input" in line
    # A timeline named like a plot, in the plots folder.
    plots = tmp_path / "p"
    plots.mkdir()
    shutil.copyfile(timeline, plots / "gantt.png")
    line = one_error_line(invoke("report", plots / "gantt.png", "--plots", plots))
    assert "gantt.png is the input" in line
    assert copy.read_bytes() == original and (plots / "gantt.png").read_bytes() == timeline.read_bytes()
    assert _listing(plots) == ["gantt.png"]


def test_sweep_refuses_a_results_folder_whose_summary_is_the_sweep_file(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    sweep = out / "summary.csv"
    sweep.write_text('scenario = "ub-p2p"\nsystem = "mini"\n[options]\nsizes = "512"\na2a_dies = 0\n')
    original = sweep.read_bytes()
    line = one_error_line(invoke("sweep", sweep, "-o", out, "--workers", "1"))
    assert "summary.csv is the input" in line
    assert sweep.read_bytes() == original and _listing(out) == ["summary.csv"]  # no point ran


# -- folders ----------------------------------------------------------------------------------------

def _no_engine(monkeypatch):
    """The run must be refused before it simulates anything."""
    import cmemu.run.pipeline
    import cmemu.trace.deepseek

    def must_not_run(*args, **kwargs):
        raise AssertionError("the work started before the output was checked")

    monkeypatch.setattr(cmemu.run.pipeline, "simulate", must_not_run)
    monkeypatch.setattr(cmemu.trace.deepseek, "decode_trace", must_not_run)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_folder_is_refused_before_the_work(command, timeline, tmp_path, monkeypatch):
    args = _commands(timeline, tmp_path)[command]
    _no_engine(monkeypatch)
    out = tmp_path / "missing" / "o.json"
    line = one_error_line(invoke(*args(out)))
    assert line == f"cmemu: error: cannot write {out}: the folder {out.parent} does not exist"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder all the same")
@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_folder_is_refused_before_the_work(command, timeline, tmp_path, monkeypatch):
    args = _commands(timeline, tmp_path)[command]
    _no_engine(monkeypatch)
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        line = one_error_line(invoke(*args(folder / "o.json")))
        assert "Permission denied" in line and _listing(folder) == []
    finally:
        folder.chmod(0o755)


def _refuse_new_files(monkeypatch, folder, code=errno.EROFS):
    """os.open fails as on a read-only file system for new files in ``folder``."""
    real = os.open

    def fake(path, flags, *args, **kwargs):
        if os.path.dirname(os.path.abspath(path)) == str(folder) and flags & os.O_CREAT:
            raise OSError(code, os.strerror(code), str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(atomic.os, "open", fake)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_file_system_is_refused_before_the_work(command, timeline, tmp_path, monkeypatch):
    args = _commands(timeline, tmp_path)[command]
    _no_engine(monkeypatch)
    folder = tmp_path / "ro"
    folder.mkdir()
    _refuse_new_files(monkeypatch, folder)
    line = one_error_line(invoke(*args(folder / "o.json")))
    assert line == (f"cmemu: error: cannot write {folder / 'o.json'}: Read-only file system "
                    f"(the folder {folder})")
    assert _listing(folder) == []


def test_report_plots_into_a_folder_that_cannot_be_made(timeline, tmp_path):
    (tmp_path / "file").write_text("x")
    line = one_error_line(invoke("report", timeline, "--plots", tmp_path / "file" / "p"))
    assert line.startswith(f"cmemu: error: cannot create the folder {tmp_path / 'file' / 'p'}: "), line


# -- a full disk ------------------------------------------------------------------------------------

H5PY_ENOSPC = ("Can't synchronously write data (file write failed: time = Mon Dec  1 00:00:00 2026\n, "
               "filename = 'x', file descriptor = 5, errno = 28, error message = 'No space left on device', "
               "buf = 0x1, total write size = 65536, bytes this sub-write = 65536, bytes actually written = "
               "18446744073709551615, offset = 0)")


def test_a_full_disk_while_the_timeline_is_written(tmp_path, monkeypatch):
    import cmemu.output.hdf5 as hdf5

    real = hdf5._write

    def write_then_fail(f, *args, **kwargs):
        real(f, *args, **kwargs)
        raise OSError(H5PY_ENOSPC)  # as h5py raises it: errno None, the cause in the message

    monkeypatch.setattr(hdf5, "_write", write_then_fail)
    trace = _copy(PINGPONG, tmp_path, "t.json")
    out = tmp_path / "out" / "t.h5"
    out.parent.mkdir()
    line = one_error_line(invoke("run", trace, "-o", out, "--quiet"))
    assert line == f"cmemu: error: cannot write {out}: No space left on device; nothing written"
    assert _listing(out.parent) == []


def test_a_failing_clean_up_adds_no_second_error(tmp_path, monkeypatch):
    # A folder made read-only during the run: the write fails, and so does removing the
    # temporary file; one line all the same.
    import cmemu.output.hdf5 as hdf5

    def fail(f, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    def no_unlink(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(hdf5, "_write", fail)
    monkeypatch.setattr(atomic.os, "unlink", no_unlink)
    trace = _copy(PINGPONG, tmp_path, "t.json")
    out = tmp_path / "t.h5"
    result = invoke("run", trace, "-o", out, "--quiet")
    monkeypatch.undo()
    line = one_error_line(result)
    assert line == f"cmemu: error: cannot write {out}: Read-only file system; nothing written"


class _FullDisk:
    """A file object whose writes fail with ENOSPC once ``room`` bytes are written."""

    def __init__(self, f, room):
        self.f, self.room = f, room

    def write(self, data):
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def _full_disk(monkeypatch, prefix, room=1000):
    """Temporary files whose names start with ``prefix`` take at most ``room`` bytes."""
    created = {}  # descriptor -> temporary file name (os.fdopen names a file by its descriptor)
    real_create, real_fdopen = atomic._Pending.create, os.fdopen

    def create(self, k):
        fd = real_create(self, k)
        created[fd] = self.tmps[k].name
        return fd

    def fdopen(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        return _FullDisk(f, room) if created.get(fd, "").startswith(prefix) else f

    monkeypatch.setattr(atomic._Pending, "create", create)
    monkeypatch.setattr(atomic.os, "fdopen", fdopen)


@pytest.mark.parametrize("command", ["export", "trace gen"])
def test_a_full_disk_while_a_text_output_is_written(command, timeline, tmp_path, monkeypatch):
    args = _commands(timeline, tmp_path)[command]
    out = tmp_path / "out" / "o.json"
    out.parent.mkdir()
    _full_disk(monkeypatch, ".o.json.tmp-")
    line = one_error_line(invoke(*args(out)))
    assert line == f"cmemu: error: cannot write {out}: No space left on device; nothing written"
    assert _listing(out.parent) == []


def test_a_full_disk_while_the_plots_are_written(timeline, tmp_path, monkeypatch):
    plots = tmp_path / "p"
    _full_disk(monkeypatch, ".op_types.png.tmp-")
    line = one_error_line(invoke("report", timeline, "--plots", plots))
    assert line == f"cmemu: error: cannot write {plots}: No space left on device; nothing written"
    assert _listing(plots) == []


def test_a_full_disk_while_a_sweep_writes_its_summary(tmp_path, monkeypatch):
    sweep = tmp_path / "s.toml"
    sweep.write_text('scenario = "ub-p2p"\nsystem = "mini"\n[options]\nsizes = "512"\na2a_dies = 0\n'
                     'op = "write"\n')
    out = tmp_path / "out"
    _full_disk(monkeypatch, ".summary.csv.tmp-", room=10)
    line = one_error_line(invoke("sweep", sweep, "-o", out, "--workers", "1", "--quiet"))
    assert line == f"cmemu: error: cannot write {out / 'summary.csv'}: No space left on device; nothing written"
    assert _listing(out) == ["points"]  # no summary, and no temporary file
    (point,) = os.listdir(out / "points")
    assert json.loads((out / "points" / point / "results.json").read_text())["status"] == "ok"


def test_reason_reads_the_errno_in_an_h5py_message():
    assert atomic._reason(OSError(H5PY_ENOSPC)) == "No space left on device"
    assert atomic._reason(OSError(errno.EACCES, "Permission denied")) == "Permission denied"
    assert atomic._reason(OSError("Unable to write (no errno)")) == "Unable to write (no errno)"


# -- any name -------------------------------------------------------------------------------------

# What a command line can pass: no NUL, no lone surrogate but those of undecodable bytes
# (surrogateescape); "/" left out so that the name is one file in the folder.
NAMES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/")
                | st.sampled_from(["\udc80", "\udcff"]), min_size=1, max_size=300).filter(
    lambda n: n not in (".", ".."))


@settings(deadline=None, max_examples=40)
@given(name=NAMES)
def test_any_output_name_is_written_whole_or_refused_in_one_line(name, timeline, tmp_path_factory):
    folder = tmp_path_factory.mktemp("names")
    result = invoke("export", "perfetto", timeline, "-o", folder / name)
    if result.exit_code == 0:
        assert _listing(folder) == [name]
    else:
        assert "File name too long" in one_error_line(result)
        assert not [n for n in _listing(folder) if ".tmp-" in n]


def test_a_name_python_cannot_encode_is_one_error(tmp_path):
    with pytest.raises(OutputError, match="not valid in this file system's encoding"):
        check_output(tmp_path / "\ud800.h5")
