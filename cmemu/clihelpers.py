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

EXIT_INPUT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM, as shells report a command stopped by kill or timeout


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, timeout, batch schedulers), raised where Python runs signal handlers, so
    that it unwinds and cleans up exactly as Ctrl-C does (a KeyboardInterrupt, not an Exception:
    no ``except Exception`` takes it for an error)."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raises Terminated for the block (in the main thread, where handlers run; not
    where SIGTERM was set to be ignored), then is handled as before."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


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
        from cmemu.output.atomic import COMMITTED

        before = len(COMMITTED)
        try:
            with sigterm_as_interrupt():
                return fn(*args, **kwargs)
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
