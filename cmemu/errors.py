"""Errors a user can act on. The CLI turns each into one line and exit status 2."""

# The command's exit statuses (cmemu.clihelpers; cmemu.__main__, which runs before click loads).
EXIT_INPUT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM, as shells report a command stopped by kill or timeout


class CmemuError(Exception):
    """Base class for every error cmemu reports to a user."""


class SpecError(CmemuError):
    """A preset or an override is invalid (unknown field, wrong type, out of range)."""


class TraceError(CmemuError):
    """A trace is invalid. The message names the file, the node id and the field."""

    def __init__(self, path, message, node_id=None, field=None):
        self.path = str(path)
        self.node_id = node_id
        self.field = field
        self.detail = message
        where = self.path
        if node_id is not None:
            where += f": node {node_id}"
        if field is not None:
            where += f": field '{field}'"
        super().__init__(f"{where}: {message}")


class SimulationError(CmemuError):
    """A run cannot finish (ops blocked forever) or broke an invariant."""


class UnroutableError(SimulationError):
    """A message has no path left through the failed parts of the fabric (args[0]: its index)."""


class DieFailedError(SimulationError):
    """An op was to start on a die that has failed (args[0]: the op's index)."""
