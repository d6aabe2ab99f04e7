"""The async streaming training loop (private package; the public names are re-exported by ``streamfit``)."""

from streamfit._public import reexport
from streamfit._stream.batching import IN_FLIGHT_EXTRA, Rebatcher, Span, TrainingBatch
from streamfit._stream.deadletter import DeadLetter, DeadLetterSink, open_dead_letter, read_dead_letters
from streamfit._stream.events import BatchEvent, IdleEvent, MetricsEvent, StreamSummary
from streamfit._stream.loop import LoopState, StreamLoop, train_stream, train_stream_sync
from streamfit._stream.metrics import ProgressiveMetrics
from streamfit._stream.options import StreamOptions
from streamfit._stream.skips import Skipped

__all__ = [
    "train_stream",
    "train_stream_sync",
    "StreamSummary",
    "StreamLoop",
    "StreamOptions",
    "LoopState",
    "BatchEvent",
    "MetricsEvent",
    "IdleEvent",
    "TrainingBatch",
    "Rebatcher",
    "ProgressiveMetrics",
    "IN_FLIGHT_EXTRA",
    "Span",
    "Skipped",
    "DeadLetter",
    "DeadLetterSink",
    "open_dead_letter",
    "read_dead_letters",
]

#: the names the root package re-exports (``streamfit.StreamLoop``, ...): their public ``__module__``
PUBLIC = ["train_stream", "train_stream_sync", "StreamSummary", "StreamLoop", "StreamOptions", "LoopState",
          "BatchEvent", "MetricsEvent", "IdleEvent", "Span", "Skipped", "DeadLetter", "DeadLetterSink", "open_dead_letter",
          "read_dead_letters"]
reexport("streamfit", globals(), PUBLIC)
