"""The bounds of /tasks' pipe intervals, which the run options and the memory budget share: in a
module that imports nothing, as the command line reads them when it starts.
"""

# /tasks: the die model's busy intervals per COMP op and pipe (cmemu run --pipe-intervals).
DEFAULT_PIPE_INTERVALS = 16
# /tasks: the most rows the die model's busy intervals (DEFAULT_PIPE_INTERVALS per COMP op and pipe)
# may take in all (about 33 B each; the limit per op is halved until they fit).
MAX_PIPE_TASK_ROWS = 4_000_000
