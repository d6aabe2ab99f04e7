"""The stream's options, written once: :class:`StreamOptions` (a frozen dataclass).

Every option of the streaming loop is one field here, with its default, its check and its help text.
``StreamLoop``, ``train_stream``, ``train_stream_sync`` and the daemon's ``Runner`` take one of these (their
keyword arguments build it); the daemon's TOML keys (:func:`streamfit.daemon.config.load_config`) and the
command line's flags (:func:`add_option_flags`) are derived from the fields, so names, defaults, checks and
help cannot disagree between the entry points.  An unknown or misspelt option, a value of the wrong type,
out of range or not among the choices fails when the object is built, naming the option (and the nearest
valid name), never deep inside ``run()``.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from streamfit.exceptions import OptionError
from streamfit.history import HistoryOptions

__all__ = ["StreamOptions", "OptionError", "SCOPES", "option_names", "add_option_flags", "options_from_flags"]

Check = Callable[[str, Any], Any]

#: ``max_batch_wait`` of ``streamfit serve`` when none is given (s): a quiet live stream's rows are trained soon
SERVE_MAX_BATCH_WAIT = 1.0


# ---------------------------------------------------------------------------------------------- checks
def _bad(name: str, value: Any, expected: str) -> OptionError:
    return OptionError(f"Invalid {name}: {value!r}, expected {expected}", option=name)


def _int(minimum: int, optional: bool = False) -> Check:
    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise _bad(name, value, f"{'None or ' if optional else ''}an int >= {minimum}")
        return int(value)
    return check


def _float(low: float, high: float | None = None, *, above: bool = False, below: bool = True,
           optional: bool = False) -> Check:
    """A number ``low <= x`` (``low < x`` with ``above``) and ``x < high`` (``x <= high`` without ``below``)."""
    lo, hi = ("(" if above else "["), ("" if high is None else (")" if below else "]"))
    shown = f"a number > {low:g}" if high is None and above else f"a number >= {low:g}" if high is None \
        else f"a number in {lo}{low:g}, {high:g}{hi}"

    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        ok = (not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating))
              and math.isfinite(value) and (value > low if above else value >= low)
              and (high is None or (value < high if below else value <= high)))
        if not ok:
            raise _bad(name, value, ("None or " if optional else "") + shown)
        return float(value)
    return check


def _wait(name: str, value: Any) -> Any:
    """Seconds > 0, ``inf`` (never) or ``None`` (the entry point's default)."""
    if value is None:
        return None
    ok = (not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating))
          and value > 0 and not math.isnan(value))
    if not ok:
        raise _bad(name, value, "None, a number of seconds > 0, or inf (never: a partial batch only at the end)")
    return float(value)


def _wait_from_text(value: Any) -> Any:
    """A TOML value or flag of ``max_batch_wait``: seconds, ``inf`` or the string ``"inf"``."""
    return float("inf") if value == "inf" else value


def _bool(name: str, value: Any) -> Any:
    if not isinstance(value, (bool, np.bool_)):
        raise _bad(name, value, "True or False")
    return bool(value)


def _directory(name: str, value: Any) -> Any:
    """None, or a directory as a non-empty str (a path-like object is taken as its path)."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise _bad(name, value, "None or a directory (a non-empty str or path)")
    return value


def _str(optional: bool) -> Check:
    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise _bad(name, value, f"{'None or ' if optional else ''}a column name (a non-empty str)")
        return value
    return check


def _label(name: str, value: Any) -> Any:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(c, str) and c for c in value):
        return tuple(value)
    raise _bad(name, value, "a column name, or a list of column names (multi-output regression)")


def _dead_letter(name: str, value: Any) -> Any:
    import os

    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str) and value:
        return value
    from streamfit._stream.deadletter import DeadLetterSink

    if isinstance(value, DeadLetterSink):
        return value
    raise _bad(name, value, "None, a JSON-lines file path, kafka://HOST:PORT/topic or a DeadLetterSink")


def _choice(*choices: Any) -> Check:
    def check(name: str, value: Any) -> Any:
        if value not in choices:
            shown = " or ".join(repr(c) for c in choices)
            near = difflib.get_close_matches(str(value), [str(c) for c in choices if c is not None], n=1)
            raise _bad(name, value, shown + (f" (did you mean {near[0]!r}?)" if near else ""))
        return value
    return check


def _columns(name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Iterable) or isinstance(value, Mapping):
        raise _bad(name, value, "None, a column name or a list of column names")
    out = tuple(value)
    if not out or not all(isinstance(c, str) and c for c in out):
        raise _bad(name, value, "None, a column name or a non-empty list of column names")
    if len(set(out)) != len(out):
        raise _bad(name, value, "distinct column names")
    return out


def _classes(name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (Iterable, np.ndarray)):
        raise _bad(name, value, "None or a list of class labels")
    out = tuple(np.asarray(value).tolist()) if isinstance(value, np.ndarray) else tuple(value)
    if not out:
        raise _bad(name, value, "None or a non-empty list of class labels")
    try:
        distinct = len(set(out)) == len(out)
    except TypeError:
        raise _bad(name, value, "class labels that are numbers, strings or bools") from None
    if not distinct:
        raise _bad(name, value, "distinct class labels")
    return out


def _dtype(name: str, value: Any) -> Any:
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise _bad(name, value, "'float32' or 'float64'") from None
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise _bad(name, value, "'float32' or 'float64'")
    return dtype.name


def _inputs(name: str, value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value or not all(isinstance(k, str) and k for k in value):
        raise _bad(name, value, "None or a mapping of model input name -> column(s) or encoder")
    return dict(value)


def _inputs_from_text(value: Any) -> Any:
    """``--input NAME=SPEC`` flags (a list) or a TOML table ``{NAME = "SPEC" or [COL, ...]}`` -> the mapping."""
    from streamfit.features import parse_input

    if value is None:
        return None
    if isinstance(value, Mapping):
        items = [f"{k}={v}" if isinstance(v, str) else (k, v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise _bad("inputs", value, "NAME=SPEC flags or a table of model input name -> spec")
    out: dict[str, Any] = {}
    for item in items:
        try:
            key, spec = parse_input(item) if isinstance(item, str) else item
        except ValueError as exc:
            raise OptionError(f"Invalid inputs: {exc}", option="inputs") from None
        if key in out:
            raise OptionError(f"Invalid inputs: --input {key}=...: model input {key!r} is mapped twice",
                              option="inputs")
        out[key] = list(spec) if isinstance(spec, tuple) else spec
    return out


# ---------------------------------------------------------------------------------------------- fields
#: what reads an option: the stream loop (every entry point), the metrics history (kept once per run: by
#: ``train_stream``/``StreamLoop`` or by the ``Runner``, never by the loops a Runner or Ray's learners run), the
#: daemon (``Runner``, ``streamfit train|serve``: the divergence guard), or scale-out on Ray (``--workers N``)
SCOPES = ("loop", "history", "daemon", "ray")


def _option(default: Any, check: Check, help: str, *, flag: str | None = None, parse: Callable[[str], Any] | None
            = None, metavar: str | None = None, append: bool = False, choices: tuple[str, ...] | None = None,
            text: Callable[[Any], Any] | None = None, scope: str = "loop", example: Any = None) -> Any:
    """A field of :class:`StreamOptions`: its default, check, help text and command-line form (``parse``: one
    flag's string -> value; ``text``: the value of a TOML key or of the collected flags -> the option's);
    ``scope`` (:data:`SCOPES`) says what reads it; ``example``: a non-default value as a flag would spell it
    (tests check that every option has a flag and a config key that agree)."""
    assert scope in SCOPES, scope
    return field(default=default, metadata={"check": check, "help": help, "flag": flag, "parse": parse,
                                            "metavar": metavar, "append": append, "choices": choices,
                                            "text": text, "scope": scope, "example": example})


def _scalar(text: str) -> Any:
    """A class label from the command line: an int when it reads as one, else the string."""
    try:
        return int(text)
    except ValueError:
        return text


def _split(text: str) -> list[str]:
    return [part for part in text.split(",")]


@dataclass(frozen=True)
class StreamOptions:
    """How a stream is read and trained on: one typed object for ``StreamLoop``, ``train_stream``,
    ``train_stream_sync``, ``Runner``, the daemon's TOML file and the command line.

    Build it from keywords (``StreamOptions(label="y", batch_size=1024)``), or let any entry point build it
    from its keyword arguments; derive a variant with :func:`dataclasses.replace`.  Every value is checked
    here: an unknown name (with the nearest valid one), a wrong type, a value out of range or not among the
    choices raises :class:`~streamfit.OptionError` (a ``ConfigError``, ``ValueError`` and ``TypeError``).

    ``on_bad`` defaults to ``"skip"`` everywhere, the daemon included: a long-running learner must never
    die on one bad message (a supervisor would restart it into the same message).  Skipped input is counted
    by reason (manifest, metrics, health file), logged with its column and position, and kept when a
    dead-letter sink is given; a run that trained no row because every row was skipped fails and says why.
    ``on_bad="raise"`` (``--on-bad raise``) stops at the first bad batch instead, naming column and position.

    Each field has a scope (:data:`SCOPES`): the loop's options apply everywhere; ``guard`` ...
    ``lr_recover_after`` describe the daemon's divergence guard (``Runner``, ``streamfit train|serve``), and
    ``workers`` ... ``checkpoint_every_rounds`` scale-out on Ray.  An entry point given an option it does not
    read (``poison_after`` to ``train_stream``) refuses it rather than ignoring it.

    Parameters
    ----------
    features
        Feature columns, comma-separated (default: every column but label and weight of the first valid batch; a
        FixedSizeList or fixed_shape_tensor column is taken zero-copy).
    inputs
        Feed model input NAME from columns, or an encoder: NAME=hashed:COL:BUCKETS, NAME=vocabulary:COL[:MIN_COUNT],
        NAME=padded:COL[:LENGTH[:PAD]] (repeatable; default: the estimator's inputs).
    label
        Label column (or several, comma-separated: multi-output regression).
    weight
        Sample-weight column (default: none).
    task
        ``"regression"`` or ``"classification"`` (default: classification iff classes are given).
    classes
        All class labels, comma-separated (default: a fitted estimator's classes_, else those of the first batch); a
        label outside them is a bad row.
    batch_size
        Rows per training batch (one ``partial_fit`` call).
    max_rows
        Stop after training this many rows (the daemon counts them over resumes).
    on_bad
        Bad input: ``"raise"`` (an error naming column and position) or ``"skip"`` (counted by reason).
    cast
        Accept integer, bool and decimal feature columns by explicit conversion.
    dtype
        Float type of the features (and of a regression label).
    drop_last
        Drop a last batch smaller than ``batch_size``.
    max_batch_wait
        Train the rows waiting for a full batch after this many seconds without new rows, while the stream stays
        open (default: serve 1 s; train and the Python API: only at the end of the stream, so batch boundaries
        depend on the data alone; inf: never).
    queue_size
        Training batches that may wait for the trainer (backpressure).
    window
        Rows in the recent-metrics window.
    evaluate
        Progressive validation: predict each batch before training on it.
    progress
        Show a progress bar (rows, rows/s, recent loss) on stderr.
    dead_letter
        Keep skipped input and poison messages here: a JSON-lines file, or kafka://HOST:PORT/topic (default: counted
        only).
    history_dir
        Keep the run's metrics history in this directory (default: none for train_stream, CHECKPOINT_DIR/history for
        the daemon); a run given a directory that holds a history continues it.
    history_every_rows
        The metrics history: an interval every this many rows (also at checkpoints).
    history_every_seconds
        ... or an interval every this many seconds, whichever comes first.
    guard
        Divergence guard: a batch whose loss turns non-finite or exceeds guard_factor x its running mean is rolled
        back and retried at a lower learning rate.
    guard_factor
        A loss above this many times its running mean is a divergence.
    guard_lr_factor
        A rollback multiplies the learning-rate scale by this.
    poison_after
        Rollbacks caused by one message before it is quarantined as poison (skipped, dead-lettered).
    min_lr_scale
        Stop with DivergenceError when rollbacks would lower the learning-rate scale below this.
    lr_recover_after
        Good batches after which a lowered learning-rate scale doubles back towards 1.
    workers
        Learner actors on a Ray cluster, each on its share of the source (extra ``[ray]``).
    ray_address
        An existing Ray cluster (default: a local instance on 127.0.0.1).
    sync_every_batches
        Mix the learners' weights every this many batches.
    sync_every_seconds
        ... or every this many seconds.
    sync_optimizer
        Mix the optimizer state (Adam's moments) with the weights.
    checkpoint_every_rounds
        A global checkpoint every this many synchronization rounds.
    learner_timeout
        Seconds a learner may leave the coordinator's ping unanswered (a stopped or deadlocked process) before it
        is declared hung, killed and replaced (the group restarts from the last global checkpoint).

    Examples
    --------
    >>> opts = StreamOptions(features="x", batch_size=64)
    >>> opts.features, opts.batch_size, opts.on_bad, opts.resolved_task
    (('x',), 64, 'skip', 'regression')
    >>> StreamOptions(batch_sise=64)
    Traceback (most recent call last):
    ...
    streamfit.exceptions.OptionError: unknown stream option 'batch_sise' (did you mean 'batch_size'?)...
    >>> StreamOptions(on_bad="skp")
    Traceback (most recent call last):
    ...
    streamfit.exceptions.OptionError: Invalid on_bad: 'skp', expected 'raise' or 'skip' (did you mean 'skip'?)
    """

    features: tuple[str, ...] | None = _option(
        None, _columns, "feature columns, comma-separated (default: every column but label and weight of the "
        "first valid batch; a FixedSizeList or fixed_shape_tensor column is taken zero-copy)",
        parse=_split, metavar="COL[,COL...]", example="a,b")
    inputs: Mapping[str, Any] | None = _option(
        None, _inputs, "feed model input NAME from columns, or an encoder: NAME=hashed:COL:BUCKETS, "
        "NAME=vocabulary:COL[:MIN_COUNT], NAME=padded:COL[:LENGTH[:PAD]] (repeatable; default: the estimator's "
        "inputs)", flag="--input", metavar="NAME=COL[,COL...]", append=True, text=_inputs_from_text,
        example="ids=hashed:city:100")
    label: str | tuple[str, ...] = _option("y", _label, "label column (or several, comma-separated: "
                                           "multi-output regression)", parse=lambda s: s if "," not in s
                                           else _split(s), metavar="COL[,COL...]", example="t")
    weight: str | None = _option(None, _str(True), "sample-weight column (default: none)", example="w")
    task: str | None = _option(None, _choice(None, "regression", "classification"),
                               "regression or classification (default: classification iff classes are given)",
                               choices=("regression", "classification"), example="classification")
    classes: tuple[Any, ...] | None = _option(
        None, _classes, "all class labels, comma-separated (default: a fitted estimator's classes_, else those "
        "of the first batch); a label outside them is a bad row", parse=lambda s: [_scalar(c) for c in _split(s)],
        metavar="A,B,...", example="0,1,two")
    batch_size: int = _option(256, _int(1), "rows per partial_fit call", parse=int, example="8")
    max_rows: int | None = _option(None, _int(0, optional=True),
                                   "stop after training this many rows (the daemon counts them over resumes)",
                                   parse=int, example="100")
    on_bad: str = _option("skip", _choice("raise", "skip"),
                          "bad input: raise (an error naming column and position) or skip (counted by reason)",
                          choices=("raise", "skip"), example="raise")
    cast: bool = _option(False, _bool, "accept integer, bool and decimal feature columns by explicit conversion",
                         example=True)
    dtype: str = _option("float32", _dtype, "float type of the features (and of a regression label)",
                         choices=("float32", "float64"), example="float64")
    drop_last: bool = _option(False, _bool, "drop a last batch smaller than batch_size", example=True)
    max_batch_wait: float | None = _option(
        None, _wait, f"train the rows waiting for a full batch after this many seconds without new rows, while "
        f"the stream stays open (default: serve {SERVE_MAX_BATCH_WAIT:g} s; train and the Python API: only at the end of the stream, "
        "so batch boundaries depend on the data alone; inf: never)", parse=float, metavar="SECONDS",
        text=_wait_from_text, example="2.5")
    queue_size: int = _option(4, _int(1), "training batches that may wait for the trainer (backpressure)",
                              parse=int, example="2")
    window: int = _option(1000, _int(1), "rows in the recent-metrics window", parse=int, example="50")
    evaluate: bool = _option(True, _bool, "progressive validation: predict each batch before training on it",
                             example=False)
    progress: bool = _option(False, _bool, "show a progress bar (rows, rows/s, recent loss) on stderr",
                             example=True)
    dead_letter: Any = _option(None, _dead_letter, "keep skipped input and poison messages here: a JSON-lines "
                               "file, or kafka://HOST:PORT/topic (default: counted only)", metavar="PATH|URI",
                               example="dead.jsonl")
    # -- the metrics history (train_stream, StreamLoop, Runner, streamfit train|serve; see streamfit.history)
    history_dir: str | None = _option(None, _directory, "keep the run's metrics history in this directory (default: "
                                      "none for train_stream, CHECKPOINT_DIR/history for the daemon); a run given "
                                      "a directory that holds a history continues it", metavar="DIR",
                                      scope="history", example="history")
    history_every_rows: int | None = _option(None, _int(1, optional=True), "the metrics history: an interval every "
                                             "N rows (also at checkpoints)", parse=int, scope="history",
                                             example="500")
    history_every_seconds: float | None = _option(10.0, _float(0.0, above=True, optional=True), "... or every S "
                                                  "seconds, whichever first", parse=float, metavar="S",
                                                  scope="history", example="2.5")
    # -- the daemon's divergence guard (Runner, streamfit train|serve)
    guard: bool = _option(True, _bool, "divergence guard: a batch whose loss turns non-finite or exceeds "
                          "guard_factor x its running mean is rolled back and retried at a lower learning rate",
                          scope="daemon", example=False)
    guard_factor: float = _option(100.0, _float(1.0, above=True), "a loss above this many times its running mean "
                                  "is a divergence", parse=float, metavar="X", scope="daemon", example="50")
    guard_lr_factor: float = _option(0.1, _float(0.0, 1.0, above=True), "a rollback multiplies the learning-rate "
                                     "scale by this", parse=float, metavar="X", scope="daemon", example="0.5")
    poison_after: int = _option(3, _int(1), "rollbacks caused by one message before it is quarantined as poison "
                                "(skipped, dead-lettered)", parse=int, scope="daemon", example="2")
    min_lr_scale: float = _option(1e-4, _float(0.0, 1.0, above=True), "stop with DivergenceError when rollbacks "
                                  "would lower the learning-rate scale below this", parse=float, metavar="X",
                                  scope="daemon", example="0.01")
    lr_recover_after: int = _option(100, _int(1), "good batches after which a lowered learning-rate scale doubles "
                                    "back towards 1", parse=int, scope="daemon", example="10")
    # -- scale-out on Ray (streamfit train|serve --workers N)
    workers: int | None = _option(None, _int(1, optional=True), "N learner actors on a Ray cluster, each on its "
                                  "share of the source (extra [ray])", parse=int, scope="ray", example="2")
    ray_address: str | None = _option(None, _str(True), "an existing Ray cluster (default: a local instance on "
                                      "127.0.0.1)", metavar="HOST:PORT", scope="ray", example="127.0.0.1:6380")
    sync_every_batches: int | None = _option(None, _int(1, optional=True), "mix the learners' weights every K "
                                             "batches", parse=int, metavar="K", scope="ray", example="16")
    sync_every_seconds: float | None = _option(None, _float(0.0, above=True, optional=True), "... or every T "
                                               "seconds", parse=float, metavar="T", scope="ray", example="0.5")
    sync_optimizer: bool = _option(True, _bool, "mix the optimizer state (Adam's moments) with the weights",
                                   scope="ray", example=False)
    checkpoint_every_rounds: int | None = _option(None, _int(1, optional=True), "a global checkpoint every R "
                                                  "synchronization rounds", parse=int, metavar="R", scope="ray",
                                                  example="4")
    learner_timeout: float | None = _option(60.0, _float(0.0, above=True, optional=True), "a learner that leaves "
                                            "the coordinator's ping unanswered this long (s) is hung: killed, "
                                            "replaced, the group restarted from the last global checkpoint",
                                            parse=float, metavar="S", scope="ray", example="10")

    def __new__(cls, *args: Any, **kwargs: Any) -> "StreamOptions":
        if args:
            raise OptionError("StreamOptions takes keyword arguments only (StreamOptions(batch_size=64, ...))")
        check_names(kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, f.metadata["check"](f.name, getattr(self, f.name)))
        if self.task == "regression" and self.classes is not None:
            raise OptionError(f"Invalid classes: {list(self.classes)!r} with task='regression' (classes are for "
                              f"classification)", option="classes")
        if self.drop_last and self.max_batch_wait is not None and not math.isinf(self.max_batch_wait):
            raise OptionError(f"Invalid max_batch_wait: {self.max_batch_wait!r} with drop_last=True (drop_last drops "
                              "the partial batch that max_batch_wait would train; give one of the two)",
                              option="max_batch_wait")
        if self.sync_every_batches is not None and self.sync_every_seconds is not None:
            raise OptionError("give one of sync_every_batches and sync_every_seconds (--sync-every-batches K or "
                              "--sync-every-seconds T), not both", option="sync_every_seconds")

    # ------------------------------------------------------------------------------------ scopes
    def loop_options(self) -> dict[str, Any]:
        """The options the stream loop reads (scope ``"loop"``), by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata["scope"] == "loop"}

    def check_scope(self, *scopes: str, where: str) -> None:
        """Refuse an option set away from its default that ``where`` does not read (nothing is ignored
        silently): e.g. ``poison_after`` given to ``train_stream``, which has no divergence guard.

        Parameters
        ----------
        *scopes
            The scopes (:data:`SCOPES`) the entry point reads.
        where
            The entry point, for the message (``"the stream loop (StreamLoop, train_stream)"``).
        """
        for f in fields(self):
            if f.metadata["scope"] not in scopes and getattr(self, f.name) != f.default:
                reader = {"daemon": "the daemon (Runner, streamfit train/serve)",
                          "history": "the run's metrics history (train_stream, Runner, streamfit train/serve)",
                          "ray": "scale-out on Ray (streamfit train/serve --workers N)"}.get(f.metadata["scope"], "")
                raise OptionError(f"{f.name}={getattr(self, f.name)!r} is an option of {reader}, which {where} is "
                                  "not", option=f.name)

    def history_options(self) -> HistoryOptions:
        """The :class:`~streamfit.history.HistoryOptions` of ``history_every_rows`` / ``history_every_seconds``."""
        return HistoryOptions(every_rows=self.history_every_rows, every_seconds=self.history_every_seconds)

    # ------------------------------------------------------------------------------------ derived
    @property
    def resolved_task(self) -> str:
        """``task``, or when it is ``None``: ``"classification"`` iff ``classes`` are given."""
        if self.task is not None:
            return self.task
        return "classification" if self.classes is not None else "regression"

    @classmethod
    def build(cls, options: "StreamOptions | Mapping[str, Any] | None" = None, **kwargs: Any) -> "StreamOptions":
        """``options`` (an object, a mapping or ``None`` = the defaults) with ``kwargs`` on top.

        Parameters
        ----------
        options
            A :class:`StreamOptions`, a mapping of its fields, or None (the defaults).
        **kwargs
            Fields set on top of ``options``.

        Examples
        --------
        >>> StreamOptions.build(StreamOptions(label="t"), batch_size=8).label
        't'
        """
        if options is None:
            return cls(**kwargs)
        if isinstance(options, Mapping):
            check_names(options)
            return cls(**{**options, **kwargs})
        if not isinstance(options, StreamOptions):
            raise OptionError(f"options must be a StreamOptions, a mapping or None, got {type(options).__name__}")
        if not kwargs:
            return options
        check_names(kwargs)
        return replace(options, **kwargs)

    def as_dict(self) -> dict[str, Any]:
        """Every option by name (a new dict; tuples stay tuples)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # ------------------------------------------------------------------------------------ TOML
    def to_toml(self, *, all: bool = False) -> str:
        """The options as TOML lines (the daemon's config file): those that differ from the default, or
        every option that has a value with ``all=True``.  ``None`` has no TOML form: such keys are left out
        (a missing key is the default).

        Parameters
        ----------
        all
            Every option that has a value, not only those away from their default.

        Examples
        --------
        >>> print(StreamOptions(features=["a", "b"], on_bad="raise").to_toml(), end="")
        features = ["a", "b"]
        on_bad = "raise"
        """
        lines = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (not all and value == f.default):
                continue
            lines.append(f"{f.name} = {_toml_value(f.name, value)}")
        return "\n".join(lines) + ("\n" if lines else "")

    @classmethod
    def from_toml(cls, text: str) -> "StreamOptions":
        """Options from TOML text holding only stream options (see :func:`streamfit.daemon.config.load_config`
        for a whole run's file).

        Parameters
        ----------
        text
            TOML: ``name = value`` lines of stream options.
        """
        import tomllib

        return from_text_values(tomllib.loads(text))


def _toml_value(name: str, value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, float):
        if value == math.inf and name == "max_batch_wait":
            return "inf"
        if not math.isfinite(value):
            raise OptionError(f"{name} = {value!r} has no TOML form", option=name)
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string for these characters
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(name, v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            if not isinstance(v, (str, list, tuple)):
                raise OptionError(f"{name}: the encoder of model input {k!r} ({type(v).__name__}) has no TOML form; "
                                  f"write it as a spec string ({k} = \"hashed:COL:BUCKETS\")", option=name)
            items.append(f"{json.dumps(k)} = {_toml_value(name, v)}")
        return "{ " + ", ".join(items) + " }"
    raise OptionError(f"{name} = {value!r} has no TOML form", option=name)


# ---------------------------------------------------------------------------------------------- names
def option_names() -> tuple[str, ...]:
    """The names of every stream option, in declaration order."""
    return tuple(f.name for f in fields(StreamOptions))


def nearest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name closest to a misspelt one, if any is close."""
    found = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return found[0] if found else None


def check_names(given: Iterable[str], *, what: str = "stream option") -> None:
    """Refuse names that are not options, naming the nearest valid one."""
    valid = option_names()
    for name in given:
        if name not in valid:
            near = nearest(name, valid)
            raise OptionError(f"unknown {what} {name!r}" + (f" (did you mean {near!r}?)" if near else "")
                              + f"; the options are: {', '.join(valid)}", option=name)


# ---------------------------------------------------------------------------------------------- CLI
def _flag(f: Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def add_option_flags(parser: Any, groups: Mapping[str, Any] | None = None) -> None:
    """One command-line flag per option (``--batch-size``, ``--on-bad``, ``--cast/--no-cast``, ...), each
    with ``default=None`` so that a flag not given leaves the config file's value (or the default);
    ``groups`` (scope -> argument group) sorts them in ``--help``."""
    import argparse

    for f in fields(StreamOptions):
        meta = f.metadata
        target = (groups or {}).get(meta["scope"], parser)
        default = "" if f.default is None else f" (default {_shown(f.default)})"
        kw: dict[str, Any] = {"dest": f.name, "default": None, "help": meta["help"] + default}
        if f.type in ("bool",):
            kw["action"] = argparse.BooleanOptionalAction
        else:
            if meta["metavar"] or meta["parse"] is int:
                kw["metavar"] = meta["metavar"] or "N"
            if meta["append"]:
                kw["action"] = "append"
            elif meta["parse"] is not None:
                kw["type"] = meta["parse"]
            if meta["choices"]:
                kw["choices"] = list(meta["choices"])
        target.add_argument(_flag(f), **kw)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def options_from_flags(values: Mapping[str, Any]) -> dict[str, Any]:
    """The stream options among parsed flags (``vars(namespace)``) that were given (not ``None``), as values
    :class:`StreamOptions` takes (``--input`` flags parsed)."""
    names = set(option_names())
    return text_values({k: v for k, v in values.items() if k in names and v is not None})


def text_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Values read from text (TOML keys, flags) -> the values the options take; unknown names refused."""
    check_names(values)
    meta = {f.name: f.metadata for f in fields(StreamOptions)}
    return {k: meta[k]["text"](v) if meta[k]["text"] is not None else v for k, v in values.items()}


def from_text_values(values: Mapping[str, Any]) -> StreamOptions:
    """:class:`StreamOptions` from values read from text (a TOML table, collected flags)."""
    return StreamOptions(**text_values(values))


def field_default(name: str) -> Any:
    f = {f.name: f for f in fields(StreamOptions)}[name]
    return None if f.default is MISSING else f.default
