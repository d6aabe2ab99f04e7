"""Model inputs from Arrow columns: encoders of categorical and list columns.

Map a model input to a column, a list of columns or one of these encoders with ``inputs=`` (estimators,
the stream loop, ``--input NAME=COL`` in the CLI).  The exported model (``to_onnx()``) takes the raw
columns and encodes them in its graph.
"""

from streamfit.features._encoders import NULL_ID, OOV_ID, Encoder, Hashed, Lengths, Mask, Padded, Vocabulary

__all__ = ["Encoder", "Hashed", "Vocabulary", "Padded", "Lengths", "Mask", "NULL_ID", "OOV_ID"]
