"""The long-running side of streamfit: checkpointed runs that resume exactly, and the ``serve`` daemon."""

from streamfit.daemon.runner import Runner, RunSummary
from streamfit.daemon.state import restore_estimator, snapshot_estimator

__all__ = ["Runner", "RunSummary", "snapshot_estimator", "restore_estimator"]
