"""Model inputs from Arrow columns: encoders of categorical and list columns.

Map a model input to a column, a list of columns or one of these encoders with ``inputs=`` (estimators,
the stream loop, ``--input NAME=COL`` in the CLI).  The exported model (``to_onnx()``) takes the raw
columns and encodes them in its graph.
"""

from streamfit._public import reexport
from streamfit.features._encoders import NULL_ID, OOV_ID, Encoder, Hashed, Lengths, Mask, Padded, Vocabulary

__all__ = ["Encoder", "Hashed", "Vocabulary", "Padded", "Lengths", "Mask", "NULL_ID", "OOV_ID", "parse_input"]


def parse_input(text: str) -> tuple[str, object]:
    """One ``--input`` flag: ``NAME=COL[,COL...]`` (columns), ``NAME=hashed:COL[,COL...]:BUCKETS[:SEED]``,
    ``NAME=vocabulary:COL[,COL...][:MIN_COUNT]``, ``NAME=padded:COL[:LENGTH[:PAD]]``, ``NAME=lengths:COL`` or
    ``NAME=mask:COL[:LENGTH]``.

    Parameters
    ----------
    text
        The flag's value, ``NAME=...`` as above.

    Examples
    --------
    >>> parse_input("x=a,b,c"), parse_input("ids=hashed:city:1000")
    (('x', ['a', 'b', 'c']), ('ids', Hashed(columns=('city',), buckets=1000, seed=0)))
    """
    name, sep, spec = text.partition("=")
    if not sep or not name or not spec:
        raise ValueError(f"--input {text!r}: expected NAME=COL[,COL...] or NAME=ENCODER:COL...")
    kind, colon, rest = spec.partition(":")
    try:
        if not colon:
            return name, spec.split(",") if "," in spec else spec
        args = rest.split(":")
        cols = args[0].split(",")
        if kind == "hashed":
            return name, Hashed(cols, int(args[1]), *(int(a) for a in args[2:3]))
        if kind == "vocabulary":
            return name, Vocabulary(cols, *(int(a) for a in args[1:2]))
        if kind == "padded":
            return name, Padded(cols[0], *(int(a) for a in args[1:2]), *(float(a) for a in args[2:3]))
        if kind == "lengths":
            return name, Lengths(cols[0], *(int(a) for a in args[1:2]))
        if kind == "mask":
            return name, Mask(cols[0], *(int(a) for a in args[1:2]))
    except (IndexError, ValueError) as exc:
        raise ValueError(f"--input {text!r}: {exc}") from None
    raise ValueError(f"--input {text!r}: unknown encoder {kind!r} (hashed, vocabulary, padded, lengths, mask)")

reexport(__name__, globals(), __all__)
