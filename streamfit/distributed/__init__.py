"""Scale-out on Ray (extra ``[ray]``): N learner actors train one model, with exactly-once global checkpoints.

A coordinator deals the source out (Kafka partitions, Parquet files), each learner runs streamfit's stream
loop on its share, and every K batches or T seconds the learners' weights (optionally optimizer state) are
mixed through Ray's object store.  See :class:`DistributedTrainer`.  Ray is imported only when a run starts.
"""

from streamfit._public import reexport
from streamfit.distributed._averaging import mix, synced_names
from streamfit.distributed._cluster import LocalRayCluster
from streamfit.distributed._coordinator import DistributedSummary, DistributedTrainer, LearnerLostError, RoundStats
from streamfit.distributed._shares import Share, plan_shares

__all__ = ["DistributedTrainer", "DistributedSummary", "RoundStats", "LearnerLostError", "LocalRayCluster",
           "Share", "plan_shares", "mix", "synced_names"]

reexport(__name__, globals(), __all__)
