"""The long-running side of streamfit: checkpointed runs that resume exactly, and the ``serve`` daemon."""

from streamfit.daemon.guard import DivergenceGuard
from streamfit.daemon.health import Metrics
from streamfit.daemon.model_options import ModelOptions
from streamfit.daemon.runner import Runner, RunSummary
from streamfit.daemon.state import restore_estimator, snapshot_estimator

__all__ = ["Runner", "RunSummary", "DivergenceGuard", "Metrics", "ModelOptions", "snapshot_estimator", "restore_estimator"]
