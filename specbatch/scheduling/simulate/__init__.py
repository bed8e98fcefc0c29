"""Simulation of scheduling on a virtual clock, and the command line of every scheduling experiment.

``continuous`` runs the admission policy the server runs (``specbatch.scheduling.admission``)
over simulated continuous-batching instances, step by step; the ``continuous_admission``
experiment compares its least-slack order with first come, first served.
``python -m specbatch.scheduling.simulate`` also runs the experiments of the static
batch-level policy, whose discrete-event simulator is ``specbatch.scheduling.static.simulate``.
"""
