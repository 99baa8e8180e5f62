"""The simulator: the scheduler on simulated devices and a virtual clock, for planning."""

from hetero.framework.simulator.metrics import RunMetrics
from hetero.framework.simulator.run import simulate
from hetero.framework.simulator.workload import Workload, WorkloadSpec, load_workload

__all__ = ["RunMetrics", "Workload", "WorkloadSpec", "load_workload", "simulate"]
