"""The ``cmemu`` command (and ``python -m cmemu``), interruptible from its first instant.

The command line (cmemu.cli) takes about 0.1 s to import: click, and the modules it names. A
Ctrl-C (SIGINT) or SIGTERM then, before the CLI's own handlers are in place, is the same one
line and exit status (130, 143) as during a command (cmemu.clihelpers), not Python's traceback
and a death by the signal. Nothing has been written yet, so there is nothing to clean up: the
handler exits at once."""
from __future__ import annotations

import os
import signal
import sys

from cmemu.errors import EXIT_INTERRUPTED, EXIT_TERMINATED

# The CLI's exit statuses and words (cmemu.clihelpers.interrupted_exit).
_STOPS = {signal.SIGINT: (EXIT_INTERRUPTED, "interrupted"), signal.SIGTERM: (EXIT_TERMINATED, "terminated")}


def _stop(signum, frame):
    code, word = _STOPS[signum]
    os.write(2, f"cmemu: {word}; no output written\n".encode())
    os._exit(code)


def _install() -> dict:
    """Our handler for SIGINT and SIGTERM (not where they are ignored); returns the ones before."""
    return {s: signal.signal(s, _stop) for s in _STOPS if signal.getsignal(s) is not signal.SIG_IGN}


def main():
    before = _install()
    from cmemu.cli import main as command_line

    for signum, handler in before.items():  # the command line installs its own as it starts
        signal.signal(signum, handler)
    return command_line()


if __name__ == "__main__":
    sys.exit(main())
