"""``open_source``: one entry point turning a URI, a path or in-memory Arrow data into a :class:`Source`.

Examples
--------
>>> import pyarrow as pa
>>> type(open_source(pa.table({"x": [1.0]}))).__name__
'MemorySource'
>>> open_source("parquet:/data/train", batch_size=4096).batch_size
4096
>>> open_source("ipc+tcp://127.0.0.1:0?max_connections=1").max_connections
1
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pyarrow as pa

from streamfit.sources._base import Source
from streamfit.sources.ipc import IpcSource, IpcTcpSource
from streamfit.sources.memory import MemoryItem, MemorySource
from streamfit.sources.parquet import ParquetSource

__all__ = ["open_source", "SUPPORTED_URIS"]

SUPPORTED_URIS = ("parquet:PATH (or a path ending in .parquet)",
                  "ipc:PATH (or a path ending in .arrow/.arrows)", "ipc:- (stdin)", "ipc+tcp://HOST:PORT", "kafka://HOST:PORT/TOPIC?group=GROUP")


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean, got {text!r}")


#: how query parameters (strings) become options; Kafka keys with a dot go to the librdkafka config.
_CONVERT: dict[str, dict[str, Callable[[str], Any]]] = {
    "parquet": {"batch_size": int, "follow": _bool, "poll_interval": float, "batch_readahead": int,
                "use_threads": _bool,
                "columns": lambda s: [c for c in s.split(",") if c]},
    "ipc": {},
    "ipc+tcp": {"max_connections": int},
    "kafka": {"group": str, "decoder": str, "max_messages": int, "poll_timeout": float, "coalesce_rows": int,
              "fetch_ahead": int, "handover_timeout": float},
}


def _query_options(kind: str, query: str, options: dict[str, Any]) -> dict[str, Any]:
    """Options from the URI query (converted), overridden by explicit keyword options."""
    out: dict[str, Any] = {}
    config: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if kind == "kafka" and "." in key:
            config[key] = value
        elif key in _CONVERT[kind]:
            try:
                out[key] = _CONVERT[kind][key](value)
            except ValueError as exc:
                raise ValueError(f"Invalid {kind} URI option {key}={value!r}: {exc}") from None
        else:
            known = ", ".join(_CONVERT[kind]) or "none"
            raise ValueError(f"Unknown {kind} URI option {key!r} (known: {known}"
                             f"{'; librdkafka keys contain a dot' if kind == 'kafka' else ''})")
    if config:
        out["config"] = {**config, **options.pop("config", {})}
    out.update(options)
    return out


def _from_string(uri: str, options: dict[str, Any]) -> Source:
    lower = uri.lower()
    if lower.startswith("kafka://"):
        parts = urlsplit(uri)
        topic = parts.path.lstrip("/")
        if not parts.netloc or not topic or "/" in topic:
            raise ValueError(f"Invalid Kafka URI {uri!r}, expected kafka://HOST:PORT/TOPIC?group=GROUP")
        opts = _query_options("kafka", parts.query, options)
        if "group" not in opts:
            raise ValueError(f"Kafka URI {uri!r} needs a consumer group: add ?group=NAME")
        from streamfit.sources.kafka import KafkaSource  # optional extra: imported only when asked for

        return KafkaSource(parts.netloc, topic, **opts)
    if lower.startswith("ipc+tcp://"):
        parts = urlsplit(uri)
        if parts.hostname is None or parts.port is None or parts.path not in ("", "/"):
            raise ValueError(f"Invalid IPC TCP URI {uri!r}, expected ipc+tcp://HOST:PORT")
        return IpcTcpSource(parts.hostname, parts.port, **_query_options("ipc+tcp", parts.query, options))
    for kind, cls in (("parquet", ParquetSource), ("ipc", IpcSource)):
        if lower.startswith(kind + ":"):
            path, _, query = uri[len(kind) + 1:].partition("?")  # a "?" starts options, as in any URI
            path = path[2:] if path.startswith("///") else path  # parquet:///abs/path
            if not path:
                raise ValueError(f"Missing path in {uri!r}")
            return cls(path, **_query_options(kind, query, options))
    return _from_path(uri, options)


def _from_path(path: str, options: dict[str, Any]) -> Source:
    lower = path.lower()
    if lower.endswith((".parquet", ".parq", ".pq")):
        return ParquetSource(path, **options)
    if lower.endswith((".arrow", ".arrows", ".ipc", ".feather")) or path == "-":
        return IpcSource(path, **options)
    raise ValueError(f"Unknown source {path!r}; supported: {'; '.join(SUPPORTED_URIS)}; "
                     f"or in-memory RecordBatch/Table/RecordBatchReader or a list of them")


def open_source(source: Source | str | os.PathLike[str] | MemoryItem | Iterable[MemoryItem],
                **options: Any) -> Source:
    """A :class:`Source` from a Source (returned as is), in-memory Arrow data, a path or a URI.

    URI query parameters become options (``kafka://127.0.0.1:9092/t?group=g&session.timeout.ms=6000``);
    keyword ``options`` override them.

    Parameters
    ----------
    source
        A :class:`Source`; a path ending in ``.parquet`` (Parquet) or ``.arrow``/``.arrows`` (Arrow IPC); a URI
        (``parquet:PATH`` for a file or a directory of them, ``ipc:PATH``, ``ipc:-`` for stdin,
        ``ipc+tcp://HOST:PORT``, ``kafka://HOST:PORT/TOPIC?group=GROUP``); or in-memory Arrow data (a
        RecordBatch, Table, RecordBatchReader or a list of them).
    **options
        The source class's own arguments (``follow=True``, ``decoder="jsonl"``, ``group=``...).

    Examples
    --------
    >>> import pyarrow as pa
    >>> sources = [pa.table({"x": [1.0]}), "parquet:data/clicks/", "kafka://127.0.0.1:9092/t?group=g"]
    >>> [type(open_source(s)).__name__ for s in sources]  # nothing is opened before the first batch
    ['MemorySource', 'ParquetSource', 'KafkaSource']
    """
    if isinstance(source, Source):
        if options:
            raise TypeError(f"open_source: options {sorted(options)} given with an already built "
                            f"{type(source).__name__}")
        return source
    if isinstance(source, os.PathLike):
        return _from_path(os.fspath(source), options)
    if isinstance(source, str):
        return _from_string(source, options)
    if isinstance(source, (pa.RecordBatch, pa.Table, pa.RecordBatchReader)) or (
            isinstance(source, Iterable) and not isinstance(source, (bytes, bytearray, dict))):
        return MemorySource(source, **options)
    raise TypeError(f"open_source: cannot make a source from {type(source).__name__}; supported: "
                    f"{'; '.join(SUPPORTED_URIS)}; or in-memory Arrow data")
