"""Learning-rate schedules: the rate for the step about to run, advanced once per batch, with a state.

Read ``schedule.lr`` before a training step, call ``schedule.step(loss)`` after it.  Pure Python, no ONNX.
"""

from __future__ import annotations

from streamfit.schedules.adaptive import Adaptive
from streamfit.schedules.base import Schedule, as_schedule, schedule_from_state_dict
from streamfit.schedules.constant import Constant
from streamfit.schedules.cosine_decay import CosineDecay
from streamfit.schedules.inv_scaling import InvScaling
from streamfit.schedules.linear_warmup import LinearWarmup
from streamfit.schedules.optimal import Optimal

__all__ = ["Schedule", "Constant", "InvScaling", "Optimal", "Adaptive", "LinearWarmup", "CosineDecay",
           "as_schedule", "schedule_from_state_dict"]
