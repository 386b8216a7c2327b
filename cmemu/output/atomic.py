"""Writing a file the user named: whole or not at all, never through a link, never over the input.

Every command that writes a user-named file goes through here: ``run``'s HDF5 timeline,
``export perfetto``, ``trace gen``, ``report --plots`` and a sweep's summary and point files.

- Before the work (``check_output``), so that a bad target does not cost a run: the target is
  not one of the command's inputs (the same file by device and inode, a hard link included); it
  is a regular file or does not exist yet (a folder, device file, FIFO or socket is refused, and
  so is a symbolic link: cmemu neither writes through a link nor replaces one, since either may
  be what someone who planted it wants); and its folder exists and takes a new file (a probe file
  is created there and removed at once, interrupts held off meanwhile, which also catches a
  read-only file system).
- While writing (``atomic_path``, ``atomic_open``, ``atomic_files``): the data goes to a new file
  in the target's folder with a random name (``.NAME.tmp-`` and 16 hex digits), created
  exclusively (``O_CREAT | O_EXCL``, which never opens a file or link planted at that name;
  h5py's mode "x" does the same), with the permissions a new file gets (0666 less the umask).
  Should that name be taken all the same, the write fails with one line and what is there is
  left alone. Interrupts are held off from the file's creation until its file object is kept,
  so that an interrupt there still has it removed, and is reported as the interrupt.
- At the end the temporary file is renamed over the target (``os.replace``: atomic, as both are
  in one folder), after the target is checked again (it may have changed during a long run).
  SIGINT and SIGTERM are held off for the renames (``signals_deferred``): several files are
  renamed together or not at all, and ``COMMITTED`` says exactly what was written before an
  interrupt.
- On any exception, an interrupt included, every temporary file is removed (interrupts held
  off for that too, and an error while removing one is not reported over the first); an
  OSError (a full disk, a folder made read-only meanwhile, h5py's errors that wrap them)
  becomes one ``OutputError`` line that names the file.

What it leaves out: SIGKILL or a crash leaves the hidden temporary file (a later run does not
reuse or remove it); nothing is fsync'ed (a power cut may lose a file just renamed); a target
that someone turns into a link between the last check and the rename has the link replaced
(never written through).
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import stat
import threading
from pathlib import Path

from cmemu.errors import CmemuError

# Outputs renamed into place by this process, in order (the CLI names those of an interrupted
# command).
COMMITTED: list[Path] = []
# The interrupts a command has taken (the exception each raised; the CLI's reports_errors latches
# them): one that Python raised where it was lost (in a destructor or a weakref callback, whose
# exceptions Python only prints) still stops the command before its outputs are renamed into
# place (``_Pending.commit``), and ends it as interrupted.
INTERRUPTS: list[type] = []

_TMP_TAG = ".tmp-"
_NAME_MAX_KEPT = 200  # of the target's name in the temporary one (names are at most 255 bytes)
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_HELD_SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s)


class OutputError(CmemuError):
    """An output cannot be written: a bad target, a missing or read-only folder, a full disk."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _reason(exc: OSError) -> str:
    """An OSError's cause in a few words: its strerror, else the errno in h5py's message."""
    if exc.errno is not None and exc.strerror:
        return exc.strerror
    m = re.search(r"errno = (\d+)", str(exc))
    if m:
        return os.strerror(int(m.group(1)))
    return " ".join(str(exc).split()) or type(exc).__name__


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _check_target(path: Path, inputs=()) -> None:
    """The target is absent or a regular file (not a link), and none of ``inputs``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {_reason(exc)}") from None
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"{path} is a symbolic link; cmemu does not write through a link or replace one: "
                          "name the file itself, or remove the link")
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{path} is {_kind(st.st_mode)}; cmemu writes only regular files: name a file")
    for src in inputs:
        if src is None:
            continue
        try:
            other = os.stat(src)
        except OSError:
            continue  # an input that cannot be read is reported where it is read
        if _same_file(st, other):
            if os.path.abspath(src) == os.path.abspath(path):
                raise OutputError(f"{path} is the input; cmemu does not write over its input: "
                                  "name another output file")
            raise OutputError(f"{path} is the input {src} under another name (the same file); cmemu does not "
                              "write over its input: name another output file")


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _tmp_name(path: Path) -> Path:
    name = path.name
    while len(os.fsencode(name)) > _NAME_MAX_KEPT:
        name = name[:-1]
    return _folder(path) / f".{name}{_TMP_TAG}{secrets.token_hex(8)}"


def _check_folder(folder: Path, target) -> None:
    """``folder`` exists and takes a new file: a probe created exclusively there and removed."""
    if not folder.exists():
        raise OutputError(f"cannot write {target}: the folder {folder} does not exist")
    if not folder.is_dir():
        raise OutputError(f"cannot write {target}: {folder} is not a folder")
    probe = folder / f".cmemu-probe{_TMP_TAG}{secrets.token_hex(8)}"
    with signals_deferred():  # an interrupt between the creation and the removal left the probe
        try:
            fd = os.open(probe, _CREATE_FLAGS, 0o600)
        except OSError as exc:
            raise OutputError(f"cannot write {target}: {_reason(exc)} (the folder {folder})") from None
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def check_output(path, inputs=()) -> Path:
    """Refuse, before any work, an output that cannot or must not be written (see the module
    docstring); ``inputs``: the command's input files. Returns ``path`` as a Path."""
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise OutputError(f"cannot write {path}: name a file, not a folder")
    try:
        os.fsencode(path)
    except UnicodeEncodeError:  # a lone surrogate, from Python (a command line cannot pass one)
        raise OutputError(f"cannot write {ascii(str(path))}: the name is not valid in this file system's "
                          "encoding") from None
    _check_target(path, inputs)
    _check_folder(_folder(path), path)
    return path


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT and SIGTERM off for the block: one that arrives meanwhile is handled (its
    handler run, or the signal sent again where it had none) when the block ends. In the main
    thread only (Python runs signal handlers there); elsewhere the block just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    old = {}
    try:
        for s in _HELD_SIGNALS:
            old[s] = signal.signal(s, lambda signum, frame: caught.append(signum))
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if caught:
            handler = old.get(caught[0])
            if callable(handler):
                handler(caught[0], None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), caught[0])


def _name_taken(exc: BaseException) -> bool:
    """The exclusive creation failed: something is at the temporary name (h5py's errors give
    the errno in their message)."""
    return isinstance(exc, OSError) and (exc.errno == errno.EEXIST or "errno = 17," in str(exc))


class _Pending:
    """Temporary files for targets, renamed over them together, or removed."""

    def __init__(self, targets, inputs, writer_creates: bool = False):
        self.writer_creates = writer_creates  # a writer creates the files (h5py's mode "x"), not create()
        self.targets = [Path(p) for p in targets]
        self.inputs = tuple(inputs)
        for p in self.targets:
            check_output(p, self.inputs)
        self.tmps = [_tmp_name(p) for p in self.targets]
        self.renamed = 0
        self.created = set()  # the temporary files this object created (not a writer)

    def create(self, k: int) -> int:
        """Create temporary file ``k`` exclusively; returns its descriptor."""
        fd = os.open(self.tmps[k], _CREATE_FLAGS, 0o666)
        self.created.add(k)
        return fd

    def commit(self) -> None:
        if INTERRUPTS:  # an interrupt was taken and lost on the way: nothing goes into place
            raise INTERRUPTS[0]()
        with signals_deferred():
            for p in self.targets:
                _check_target(p, self.inputs)
            for tmp, p in zip(self.tmps, self.targets):
                os.replace(tmp, p)
                self.renamed += 1
                COMMITTED.append(p)

    def discard(self, taken: bool = False) -> None:
        """Remove the temporary files not renamed: those this object created, and, unless
        ``taken`` (an exclusive creation found its name taken: what is there is not ours), those
        a writer was to create."""
        with signals_deferred():
            for k in range(self.renamed, len(self.tmps)):
                if k in self.created or (self.writer_creates and not taken):
                    with contextlib.suppress(OSError):
                        os.unlink(self.tmps[k])


@contextlib.contextmanager
def _guarded(pending: _Pending, before_commit=None):
    try:
        yield
        if before_commit is not None:
            before_commit()
        pending.commit()
    except BaseException as exc:
        taken = _name_taken(exc) and pending.renamed == 0
        pending.discard(taken)
        if isinstance(exc, OSError):
            one = len(pending.targets) == 1
            target = pending.targets[0] if one else _folder(pending.targets[0])
            if taken:
                reason = "a file appeared at the temporary name (" + ", ".join(p.name for p in pending.tmps) + ")"
            else:
                reason = _reason(exc)
            done = pending.targets[:pending.renamed]
            written = f"only {', '.join(map(str, done))} written" if done else "nothing written"
            raise OutputError(f"cannot write {target}: {reason}; {written}") from None
        raise


@contextlib.contextmanager
def atomic_path(path, inputs=()):
    """Yield a temporary path beside ``path`` that does not exist yet, for a writer that
    creates its file exclusively itself (``h5py.File(tmp, "x")``); renamed over ``path`` when
    the block ends without an exception, removed otherwise."""
    pending = _Pending([path], inputs, writer_creates=True)
    with _guarded(pending):
        yield pending.tmps[0]


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", inputs=(), **open_kwargs):
    """Yield a file object (``open``'s ``mode``, "w" or "wb", and keyword arguments) on a new
    temporary file beside ``path``, renamed over ``path`` once closed, removed on any exception."""
    with atomic_files([path], mode, inputs, **open_kwargs) as (f,):
        yield f


@contextlib.contextmanager
def atomic_files(paths, mode: str = "wb", inputs=(), **open_kwargs):
    """Yield a list of file objects, one per path; all are renamed into place together when the
    block ends without an exception, and none otherwise."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_files writes new files: mode 'w' or 'wb', not {mode!r}")
    pending = _Pending(paths, inputs)
    files = []

    def close_all():
        while files:
            files.pop().close()

    try:
        with _guarded(pending, before_commit=close_all):
            for k in range(len(pending.targets)):
                # Interrupts held off from the creation until the file object is in the list:
                # one between them left the temporary file, or dropped a file object that had
                # taken the descriptor, which then closed twice (EBADF over the interrupt).
                with signals_deferred():
                    fd = pending.create(k)
                    try:
                        files.append(os.fdopen(fd, mode, **open_kwargs))
                    except BaseException:
                        os.close(fd)
                        raise
            yield list(files)
    finally:
        for f in files:  # after an exception: closed without a second error over the first
            with contextlib.suppress(OSError):
                f.close()


def output_folder(path) -> Path:
    """A folder for outputs (``report --plots``, a sweep's results): created if missing (with
    its parents), refused if it is something else or takes no new file."""
    path = Path(path)
    if path.exists() and not path.is_dir():  # a link to a folder is a folder here
        raise OutputError(f"{path} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the folder {path}: {_reason(exc)}") from None
    _check_folder(path, f"into {path}")
    return path


__all__ = ["COMMITTED", "OutputError", "atomic_files", "atomic_open", "atomic_path", "check_output",
           "output_folder", "signals_deferred"]
