"""Discrete-event simulator of the static batch-level policy, and the experiments that reproduce the papers.

Workers take whole batches from a ``SchedulingPolicy`` on a virtual clock; a batch lasts as
long as its longest member. The live server runs none of this (it admits prompts to
continuously batching instances, ``specbatch.scheduling.admission``).

- ``workload``: arrival processes, length laws, length predictors, ``draw_workload``;
- ``cluster``: the simulated servers (``ClusterConfig``) and their ``ServiceTimeModel``;
- ``engine``: the ``Simulator``; ``records``: what a run records; ``metrics``: its summary;
- ``theory``: the closed forms of Guldogan et al. (2024) it is checked against;
- ``experiments``: Theorem 4.2, Figure 6, dynamic vs static B, the four-policy comparison;
  ``report`` and ``plots``: their tables, JSON and figures.
"""
