"""Discrete-event simulator for the scheduling policy, and the experiments that reproduce the papers."""

from specbatch.scheduling.simulate.engine import BatchRecord, ClusterConfig, SimulationResult, Simulator
from specbatch.scheduling.simulate.metrics import BinMetrics, SimulationMetrics
from specbatch.scheduling.simulate.service import ServiceTimeModel
from specbatch.scheduling.simulate.theory import max_multibin_throughput, theoretical_multibin_throughput
from specbatch.scheduling.simulate.workload import (
    BinConfusionPredictor,
    EmpiricalLengths,
    GammaLengths,
    NoisyPredictor,
    OnOffArrivals,
    OraclePredictor,
    PoissonArrivals,
    StepArrivals,
    UniformLengths,
    Workload,
    make_workload,
)

__all__ = [
    "BatchRecord",
    "BinConfusionPredictor",
    "BinMetrics",
    "ClusterConfig",
    "EmpiricalLengths",
    "GammaLengths",
    "NoisyPredictor",
    "OnOffArrivals",
    "OraclePredictor",
    "PoissonArrivals",
    "ServiceTimeModel",
    "SimulationMetrics",
    "SimulationResult",
    "Simulator",
    "StepArrivals",
    "UniformLengths",
    "Workload",
    "make_workload",
    "max_multibin_throughput",
    "theoretical_multibin_throughput",
]
