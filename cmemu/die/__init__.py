"""The die model: one Ascend 910C die as AIC/AIV pipes, on-chip buffers, an L2 cache and HBM
stacks (docs/machine.md 2.1-2.3). docs/model.md says what is modelled and what is left out.

- ``model``: the DieSpec compiled to integers (``DieModel``) and the result type ``OpCost``;
- ``pipeline``: pipes as in-order instruction queues (``run_program``, Numba + reference);
- ``template``: schedules made of repeated blocks (``expand``);
- ``hbm``: pseudo-channels with banks, rows, bursts, turnaround and refresh (``pc_schedule``);
- ``l2``: an LRU over the blocks a schedule reads (``lru_run``);
- ``gemm``: (grouped) GEMM tile schedules; ``kernels``: vector ops, attention, generic ops;
- ``mla``: MLA decode (absorbed) and prefill; ``ops``: trace attributes -> cost (``node_cost``).

Every Numba kernel ``k`` is compiled with ``cache=True``; ``k.py_func`` is its pure-Python
reference, the same algorithm run by the interpreter, which the tests compare with ``k``.
Nothing here is imported by ``import cmemu``: Numba loads when a COMP is first costed.
"""
