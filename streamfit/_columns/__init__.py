"""The column plan, one package: Arrow record batches -> model inputs, labels and weights.

One plan type (:class:`~streamfit._columns.plan.ColumnPlan`) serves the stream's rebatcher, the estimators'
and the Trainer's ``inputs=`` in memory (:class:`~streamfit._columns.memory.ColumnInputs`) alike; the feature
matrix of ``features=`` is its single-input case.  Its parts, one module each:

* :mod:`.schema`: finding columns by name, element kinds, a type's name in messages;
* :mod:`.mapping`: which columns (or encoder) feed each model input (:class:`ColumnMapping`), checked per
  schema, and a record batch's values per input;
* :mod:`.values`: Arrow columns as numpy, and the row checks (nulls, non-finite, out of range);
* :mod:`.labels`: the label's plan and the stream's classes, the weights;
* :mod:`.layout`: the run's column plan as state (:class:`ColumnLayout`, saved in checkpoints);
* :mod:`.plan`: the plan itself; :mod:`.memory`: in-memory tables through it.

Type policy (nothing is coerced silently):

* features, a regression label and weights must be floating columns (float16/32/64); they are converted
  to the training ``dtype`` (a change of float precision, not of kind).  Integer, bool and decimal
  columns are refused ("column 'x3' is int64, expected float32") unless ``cast=True`` is given.
* a feature may also be a vector column: ``FixedSizeList<float, d>`` or ``fixed_shape_tensor``
  (width = product of the shape); it is taken zero-copy when a training batch lies inside one record batch;
  a dictionary column of numbers is decoded.
* a classification label is an integer, string, large_string, dictionary or bool column, mapped through
  the classes (given, or learned from the first batch as ``partial_fit(classes=)`` takes them): a label not
  among them is a bad row (``unknown_class``).  With ``cast=True`` float columns are accepted; float rows
  that are not whole numbers are bad rows (``non_integer_label``).
* a regression label is one float column, several (multi-output ``[n, k]``) or one ``FixedSizeList`` /
  ``fixed_shape_tensor`` column (``[n, d]``).
* strings, nested lists, timestamps... are refused as features (``wrong_type``), even with ``cast=True``:
  strings need an encoder (:mod:`streamfit.features`).

Schema policy: columns are read by name (extra columns are ignored, reordered ones read where they are);
a schema with a name that is not valid UTF-8 (``invalid_name``) or with a column the plan reads present
twice (``duplicate_column``) is refused as a whole, never read as "first wins".

The run's column plan is state (:class:`~streamfit._columns.layout.ColumnLayout`): the feature order and widths (or the model inputs'
mapping), label, weight and dtype fixed once, saved in checkpoints and enforced on resume, so a message with
extra or reordered columns never changes what the model is fed.
"""

from streamfit._columns.labels import LabelPlan, Labels, plan_label
from streamfit._columns.layout import ColumnLayout
from streamfit._columns.mapping import ColumnMapping, InputSource, check_inputs, normalize_inputs
from streamfit._columns.memory import ColumnInputs, as_record_batch
from streamfit._columns.plan import FEATURES, ColumnPlan, Extracted, SchemaPlan
from streamfit._columns.schema import ColumnProblem, find_column, kind, schema_names

__all__ = ["ColumnPlan", "SchemaPlan", "Extracted", "ColumnMapping", "InputSource", "ColumnInputs", "ColumnLayout",
           "ColumnProblem", "LabelPlan", "Labels", "plan_label", "check_inputs", "normalize_inputs", "as_record_batch",
           "find_column", "kind", "schema_names", "FEATURES"]
