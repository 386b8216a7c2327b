"""What a run's results are made of once the engine is done: the post-run views a timeline,
a report and the scenarios read.

- ``result``: ``RunResult``, what one replay produced (the engine's run, or the user's view of it).
- ``view``: the user's view of a run (``trace_result``): the trace's own ops and messages, the
  lowering's added ops as tasks.
- ``hbm``: the HBM bytes per die, stack and time bin.
- ``pipe_tasks``: the die model's pipe busy intervals of the COMP ops, as /tasks rows.
- ``packets``: the engine's packet records as /packets rows.
- ``moe``: each MoE combine with the dispatch whose tokens it brings back.
- ``overlap``: time per die from op intervals: busy time, and the two measures of exposed
  communication (by op type, the timeline's; by op class, the step scenarios').
- ``limits``: the bounds of /tasks' pipe intervals (the run options' default among them).
- ``columns``: the Numba column kernels (orders by small integer keys, exact sums) they and the
  timeline writer use.
"""
