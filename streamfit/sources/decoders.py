"""Decoders of message bytes into one record batch (Kafka values): Arrow IPC stream, JSON lines, CSV.

A decoder is any ``Callable[[bytes], pa.RecordBatch]``; raising marks the message undecodable.  Give the
text decoders a ``schema``: inferred types can differ from one message to the next.

Examples
--------
>>> decode = json_lines_decoder(pa.schema([("x", pa.float32())]))
>>> decode(b'{"x": 1}\\n{"x": 2.5}\\n').to_pydict()
{'x': [1.0, 2.5]}
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson

__all__ = ["Decoder", "ipc_decoder", "json_lines_decoder", "csv_decoder", "get_decoder"]

Decoder = Callable[[bytes], pa.RecordBatch]


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in table.schema], schema=table.schema)


def ipc_decoder(data: bytes) -> pa.RecordBatch:
    """Decode an Arrow IPC stream (zero copy for a single batch; several batches are concatenated).

    The batch is fully validated (buffer sizes, offsets, dictionary indices, UTF-8; microseconds), so
    corrupt bytes raise here (an undecodable message) instead of being read out of bounds later.  A stream
    with a schema and no batch decodes to an empty batch (the column plan counts it as ``empty_batch``).

    Parameters
    ----------
    data
        The message's bytes: an Arrow IPC stream (schema, then record batches).

    Examples
    --------
    >>> import pyarrow as pa
    >>> sink = pa.BufferOutputStream()
    >>> with pa.ipc.new_stream(sink, pa.schema([("x", pa.float32())])) as writer:
    ...     writer.write_batch(pa.record_batch({"x": pa.array([1.0, 2.0], pa.float32())}))
    >>> ipc_decoder(sink.getvalue().to_pybytes()).to_pydict()
    {'x': [1.0, 2.0]}
    """
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    batches = list(reader)
    batch = batches[0] if len(batches) == 1 else _one_batch(pa.Table.from_batches(batches, schema=reader.schema))
    batch.validate(full=True)
    return batch


def json_lines_decoder(schema: pa.Schema | None = None) -> Decoder:
    """Decoder of newline-delimited JSON objects; ``schema`` fixes the types and drops other fields.

    Parameters
    ----------
    schema
        The columns and their types (fields not in it are dropped); None: inferred per message.

    Examples
    --------
    >>> import pyarrow as pa
    >>> decode = json_lines_decoder(pa.schema([("x", pa.float64()), ("label", pa.int64())]))
    >>> decode(b'{"x": 1.5, "label": 1, "user": "a"}\\n{"x": 3, "label": 0}\\n').to_pydict()
    {'x': [1.5, 3.0], 'label': [1, 0]}
    """
    parse = pajson.ParseOptions(explicit_schema=schema,
                                unexpected_field_behavior="ignore" if schema is not None else "infer")

    def decode(data: bytes) -> pa.RecordBatch:
        return _one_batch(pajson.read_json(pa.BufferReader(data), parse_options=parse))

    return decode


def csv_decoder(schema: pa.Schema | None = None, *, header: bool = True, delimiter: str = ",") -> Decoder:
    """Decoder of CSV text; ``header=False`` takes column names from ``schema`` (required then).

    Parameters
    ----------
    schema
        The columns and their types (columns not in it are dropped); None: inferred per message.
    header
        Whether each message starts with a row of column names; False takes them from ``schema``.
    delimiter
        The field separator.

    Examples
    --------
    >>> import pyarrow as pa
    >>> decode = csv_decoder(pa.schema([("x", pa.float64()), ("label", pa.int64())]), header=False)
    >>> decode(b"1.5,1\\n3,0\\n").to_pydict()
    {'x': [1.5, 3.0], 'label': [1, 0]}
    """
    if not header and schema is None:
        raise ValueError("csv_decoder(header=False) needs a schema for the column names")
    read = pacsv.ReadOptions(column_names=None if header else schema.names)  # type: ignore[union-attr]
    parse = pacsv.ParseOptions(delimiter=delimiter)
    convert = pacsv.ConvertOptions(column_types=schema, include_columns=schema.names if schema else None)

    def decode(data: bytes) -> pa.RecordBatch:
        return _one_batch(pacsv.read_csv(pa.BufferReader(data), read_options=read, parse_options=parse,
                                         convert_options=convert))

    return decode


_NAMED: dict[str, Callable[[], Decoder]] = {
    "ipc": lambda: ipc_decoder, "arrow": lambda: ipc_decoder,
    "jsonl": json_lines_decoder, "json": json_lines_decoder, "csv": csv_decoder,
}


def get_decoder(decoder: str | Decoder) -> Decoder:
    """A decoder from a callable or a name: ``"ipc"`` (default), ``"jsonl"`` or ``"csv"``."""
    if callable(decoder):
        return decoder
    if decoder not in _NAMED:
        raise ValueError(f"Unknown decoder {decoder!r}, expected a callable or one of: {', '.join(_NAMED)}")
    return _NAMED[decoder]()
