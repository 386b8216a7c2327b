"""What every command shares: one-line errors with exit status 2, Ctrl-C and SIGTERM as one line
with exit status 130 and 143 (``reports_errors``), and the memory-size option type (``MemorySize``).
The CLI, the scenarios' commands and the sweeps' option checks use them."""
from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading

import click

from cmemu.errors import CmemuError
from cmemu.output.atomic import COMMITTED, INTERRUPTS

EXIT_INPUT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM, as shells report a command stopped by kill or timeout


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, timeout, batch schedulers), raised where Python runs signal handlers, so
    that it unwinds and cleans up exactly as Ctrl-C does (a KeyboardInterrupt, not an Exception:
    no ``except Exception`` takes it for an error)."""


def _latching(exc_type):
    """A signal handler that raises ``exc_type`` where Python runs handlers, and latches it
    (cmemu.output.atomic.INTERRUPTS)."""

    def handler(signum, frame):
        INTERRUPTS.append(exc_type)
        raise exc_type()

    return handler


_raise_terminated = _latching(Terminated)
_raise_interrupted = _latching(KeyboardInterrupt)


@contextlib.contextmanager
def signals_as_interrupts():
    """SIGTERM raises Terminated for the block (in the main thread, where handlers run; not
    where SIGTERM was set to be ignored), then is handled as before; SIGINT raises
    KeyboardInterrupt as Python's own handler does (not where it was set to be ignored). Both are
    latched (cmemu.output.atomic.INTERRUPTS, cleared as the outermost block starts and ends): an interrupt
    that Python raised where it is lost (in a destructor) still keeps the command's outputs out
    of place and ends it as interrupted (reports_errors)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {}
    for signum, handler in ((signal.SIGTERM, _raise_terminated), (signal.SIGINT, _raise_interrupted)):
        current = signal.getsignal(signum)
        if current not in (signal.SIG_IGN, handler):
            old[signum] = signal.signal(signum, handler)
    if old:  # the outermost block: a new command
        INTERRUPTS.clear()
    try:
        yield
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
        if old:  # the command is over: what follows in this process (a library call) is not its
            INTERRUPTS.clear()


def interrupted_exit(exc: KeyboardInterrupt, message: str) -> None:
    """One line ``cmemu: interrupted; MESSAGE`` (``terminated`` for SIGTERM), exit 130 or 143."""
    term = isinstance(exc, Terminated)
    click.echo(f"cmemu: {'terminated' if term else 'interrupted'}; {message}", err=True)
    sys.exit(EXIT_TERMINATED if term else EXIT_INTERRUPTED)


def one_line(message: str) -> str:
    return " ".join(str(message).splitlines())


def _fail(message: str) -> None:
    click.echo(f"cmemu: error: {one_line(message)}", err=True)
    sys.exit(EXIT_INPUT_ERROR)


def reports_errors(fn):
    """Turn CmemuError (bad trace, bad preset, blocked run, unwritable output) into one line and
    exit status 2, and Ctrl-C (SIGTERM) into one line and exit status 130 (143). Output files
    are only ever renamed into place when complete (cmemu.output.atomic), so an interrupted
    command leaves none; the line names any it had renamed into place before the interrupt."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = len(COMMITTED)
        try:
            with signals_as_interrupts():
                out = fn(*args, **kwargs)
                if INTERRUPTS:  # taken, and lost on the way (signals_as_interrupts)
                    raise INTERRUPTS[0]()
                return out
        except CmemuError as exc:
            _fail(str(exc))
        except KeyboardInterrupt as exc:
            written = COMMITTED[before:]
            interrupted_exit(exc, f"wrote {', '.join(map(str, written))} before it" if written
                             else "no output written")

    return wrapper


class MemorySize(click.ParamType):
    """A memory size on the command line: 2GB, 512MiB or bytes (cmemu.units.parse_memory_size)."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        from cmemu.units import parse_memory_size

        try:
            return parse_memory_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
