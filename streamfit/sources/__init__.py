"""Data sources: async iterators of record batches with restartable positions.

In memory, Arrow IPC (file, stdin, TCP), Parquet (files, directories, followed directories) and Kafka
(extra ``[kafka]``: confluent-kafka is imported only when a KafkaSource is built).  Use :func:`open_source`.
"""

from __future__ import annotations

from streamfit._public import reexport
from streamfit.sources._base import Position, Source, SourceBatch
from streamfit.sources.decoders import Decoder, csv_decoder, ipc_decoder, json_lines_decoder
from streamfit.sources.ipc import IpcSource, IpcTcpSource
from streamfit.sources.kafka import KafkaSource
from streamfit.sources.memory import MemorySource
from streamfit.sources.parquet import ParquetSource
from streamfit.sources.uri import SUPPORTED_URIS, open_source

__all__ = [
    "Position",
    "Source",
    "SourceBatch",
    "MemorySource",
    "IpcSource",
    "IpcTcpSource",
    "ParquetSource",
    "KafkaSource",
    "Decoder",
    "ipc_decoder",
    "json_lines_decoder",
    "csv_decoder",
    "open_source",
    "SUPPORTED_URIS",
]


reexport(__name__, globals(), __all__)
