"""What every command shares: one-line errors with exit status 2, Ctrl-C and SIGTERM as one line
with exit status 130 and 143 (``reports_errors``, and ``CommandLine`` around the whole command
line), and the memory-size option type (``MemorySize``).
The CLI, the scenarios' commands and the sweeps' option checks use them."""
from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading

import click

from cmemu.errors import EXIT_INPUT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED, CmemuError
from cmemu.output.atomic import COMMITTED, INTERRUPTS


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, timeout, batch schedulers), raised where Python runs signal handlers, so
    that it unwinds and cleans up exactly as Ctrl-C does (a KeyboardInterrupt, not an Exception:
    no ``except Exception`` takes it for an error)."""


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) under the CLI's handler: a KeyboardInterrupt of cmemu's own type, so that
    CPython never takes it for one the program left unhandled. CPython marks the process as ended
    by an unhandled KeyboardInterrupt whenever one of that exact type ends a string ``exec`` or
    ``eval`` (the methods that dataclasses and namedtuple make with ``exec`` as a module imports),
    even if a caller catches it; after the exit, ``python -m`` then kills itself with SIGINT (-2),
    in place of the exit status 130 the command chose. CPython checks the exact type: a subclass
    (this one, Terminated) is never marked."""


def _latching(exc_type):
    """A signal handler that raises ``exc_type`` where Python runs handlers, and latches it
    (cmemu.output.atomic.INTERRUPTS)."""

    def handler(signum, frame):
        INTERRUPTS.append(exc_type)
        raise exc_type()

    return handler


_raise_terminated = _latching(Terminated)
_raise_interrupted = _latching(Interrupted)


@contextlib.contextmanager
def signals_as_interrupts():
    """SIGTERM raises Terminated for the block (in the main thread, where handlers run; not
    where SIGTERM was set to be ignored), then is handled as before; SIGINT raises Interrupted, a
    KeyboardInterrupt as with Python's own handler (not where it was set to be ignored). Both are
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
            _interrupted_exit_since(exc, before)

    return wrapper


def _interrupted_exit_since(exc: KeyboardInterrupt, before: int) -> None:
    """interrupted_exit, naming the outputs renamed into place since ``COMMITTED[before]``."""
    written = COMMITTED[before:]
    interrupted_exit(exc, f"wrote {', '.join(map(str, written))} before it" if written else "no output written")


@contextlib.contextmanager
def _interrupts_exit(before: int):
    try:
        yield
    except KeyboardInterrupt as exc:
        _interrupted_exit_since(exc, before)


class CommandLine(click.Group):
    """The command line's top group: the whole command line (its options parsed, the group's
    callback, a subcommand looked up and run) under the handlers of ``signals_as_interrupts``, so
    that Ctrl-C (SIGTERM) outside a command's ``reports_errors`` (as the command line is parsed,
    or as the modules it needs import) is the same one line and exit status 130 (143), not
    click's "Aborted!" and exit status 1 (nor, for SIGTERM, a death by the signal)."""

    def main(self, *args, **kwargs):
        before = len(COMMITTED)
        with signals_as_interrupts(), _interrupts_exit(before):
            return super().main(*args, **kwargs)

    # click takes a KeyboardInterrupt in these two for "Aborted!": the line comes first.
    def make_context(self, *args, **kwargs):
        with _interrupts_exit(len(COMMITTED)):
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        before = len(COMMITTED)
        with _interrupts_exit(before):
            out = super().invoke(ctx)
            if INTERRUPTS:  # taken, and lost on the way, outside a command's reports_errors
                raise INTERRUPTS[0]()
            return out


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
