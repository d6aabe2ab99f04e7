"""On-disk checkpoints: atomic, checksummed directories of model bytes, named arrays and JSON meta.

The format knows nothing of the training engine: it stores what it is given, refuses pickle, and
survives a crash at any instant (see :class:`CheckpointStore`).
"""

from streamfit._public import reexport
from streamfit.checkpoint._async import AsyncCheckpointWriter, WriteResult
from streamfit.checkpoint._chain import ArrayBlocks, ChainLink, RowDelta, TableArrays
from streamfit.checkpoint._format import FORMAT_VERSION, Checkpoint
from streamfit.checkpoint._fs import publish
from streamfit.checkpoint._publish import BackgroundPublisher, PublishResult, apply_published_delta, delta_path
from streamfit.checkpoint._store import CheckpointInfo, CheckpointStore

__all__ = [
    "ArrayBlocks",
    "AsyncCheckpointWriter",
    "BackgroundPublisher",
    "ChainLink",
    "Checkpoint",
    "CheckpointInfo",
    "CheckpointStore",
    "FORMAT_VERSION",
    "PublishResult",
    "RowDelta",
    "TableArrays",
    "WriteResult",
    "apply_published_delta",
    "delta_path",
    "publish",
]

reexport(__name__, globals(), __all__)
