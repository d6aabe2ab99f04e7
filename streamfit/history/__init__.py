"""A run's metrics history: one typed record per interval, kept in JSON lines beside the checkpoints.

Every checkpointed run (``streamfit train``/``serve``, :class:`~streamfit.daemon.Runner`, the distributed
coordinator) appends to ``CHECKPOINT_DIR/history/``: per interval (rows or seconds, and at every checkpoint
and rollback point) the progressive metrics over the interval, rows/s, skips by reason, checkpoints (write
time and bytes), rollbacks and quarantines, the learning-rate scale and the source's lag where known.  A
resumed run cuts what the crashed process wrote after the checkpoint it resumes from, so the intervals meet
without gap or overlap.  ``streamfit report`` draws it; the trackers (MLflow, TensorBoard) replay it.
"""

from streamfit._public import reexport
from streamfit.history._file import History, HistoryLog, history_dir, read_history
from streamfit.history._observer import HistoryOptions, HistorySink, Progress, RunHistory
from streamfit.history._records import SCHEMA_VERSION, CheckpointMark, Interval, RollbackMark, RunStart

__all__ = ["SCHEMA_VERSION", "CheckpointMark", "History", "HistoryLog", "HistoryOptions", "HistorySink", "Interval", "Progress",
           "RollbackMark", "RunHistory", "RunStart", "history_dir", "read_history"]

reexport(__name__, globals(), __all__)
