"""The engine: one background loop per workload, and the decision cache every RPC reads.

`engine` schedules the loops; `schedule` is the tick grid (pure); `turns` the event-loop turns;
`warm_start` a new loop's replay of history; `evaluation` one live tick; `workload` a workload's
state and what it publishes; `admission` which triggers get a loop; `faults` what an RPC answers
instead of a decision.
"""

from gpu_queue_scaler.engine.engine import Engine
from gpu_queue_scaler.engine.faults import Fault, NoDecisionError
from gpu_queue_scaler.engine.workload import Workload

__all__ = ["Engine", "Fault", "NoDecisionError", "Workload"]
