"""The async streaming training loop (private package; the public names are re-exported by ``streamfit``)."""

from streamfit._stream.batching import IN_FLIGHT_EXTRA, Rebatcher, TrainingBatch
from streamfit._stream.events import BatchEvent, MetricsEvent, StreamSummary
from streamfit._stream.loop import LoopState, StreamLoop, train_stream, train_stream_sync
from streamfit._stream.metrics import ProgressiveMetrics
from streamfit._stream.options import StreamOptions

__all__ = [
    "train_stream",
    "train_stream_sync",
    "StreamSummary",
    "StreamLoop",
    "StreamOptions",
    "LoopState",
    "BatchEvent",
    "MetricsEvent",
    "TrainingBatch",
    "Rebatcher",
    "ProgressiveMetrics",
    "IN_FLIGHT_EXTRA",
]
