"""Preflight: build both step graphs of a model and run one step of each batch-size class in a subprocess.

A bug in an onnxruntime-training kernel (AveragePoolGrad's SIGFPE, a SIGSEGV) kills the process that runs
it, without a Python exception, a checkpoint or a log line; a supervisor would restart it into the same
crash.  So before training on a model it has not checked, ``streamfit train``/``serve`` runs the steps it
will run (fused at 1, 7 and 64 rows: small and large-batch graphs; forward/backward at 1 and 64) in a child
process, on the stream's first rows when the run can read them ahead (a file source), else on synthetic inputs
like the data the model expects (its declared types; floats normal, integer inputs named like a mask all ones,
ids inside the embedding table they index).  A failure the inputs may cause (a non-finite step, onnxruntime
refusing a shape or an index at a node) is a warning, not a refusal; a model that cannot be prepared, whose
gradient cannot be built, or that crashes is refused.  A child that dies names the stage it was in; the op is
then located by running growing prefixes of that stage's graph in further children.

Results are cached by the SHA-256 of the model, the loss, the optimizer, the weights chosen, whether the
stream's rows were used, and the versions of streamfit and onnxruntime, as JSON files in
``$STREAMFIT_CACHE_DIR`` or else ``$XDG_CACHE_HOME/streamfit/preflight`` (``~/.cache/streamfit/preflight``).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

__all__ = ["PreflightResult", "check_model", "cache_dir", "write_rows", "SINGLE"]

#: (strategy, rows) run by the child, in order: the small- and large-batch fused graphs, then forward/backward
STAGES: tuple[tuple[str, int], ...] = (("fused", 1), ("fused", 7), ("fused", 64), ("forward_backward", 1),
                                       ("forward_backward", 64))
TIMEOUT = 300.0


@dataclass(frozen=True)
class PreflightResult:
    """What the preflight found: ``ok``, or the stage that failed, how, and the op where it can tell."""

    ok: bool
    model_sha256: str
    stage: str | None = None  # "fused, 64 rows", "building the gradient", ...
    error: str | None = None  # the exception message, or "killed by SIGFPE"
    signal: str | None = None
    op: str | None = None  # "AveragePoolGrad (node 'x_grad')" when located
    cached: bool = False
    notes: tuple[str, ...] = field(default=())

    def message(self) -> str:
        if self.ok:
            only_fused = any("(no forward/backward stage)" in n for n in self.notes)
            what = "the fused step" if only_fused else "both step strategies"
            if any(FALLBACK_NOTE in n for n in self.notes):
                what = "the forward/backward step: the fused step fails on this model"
            return f"model {self.model_sha256[:12]}: preflight passed ({what}, 1/7/64 rows)"
        where = f" in op {self.op}" if self.op else ""
        crash = " (a crash inside onnxruntime-training: it would kill a training process)" if self.signal else ""
        return (f"model {self.model_sha256[:12]} refused: {self.stage}: {self.error}{where}{crash}. "
                "Rewrite or remove that op, or train the model with another tool.")


def cache_dir() -> Path:
    """Where preflight results are cached (see the module docstring)."""
    if os.environ.get("STREAMFIT_CACHE_DIR"):
        return Path(os.environ["STREAMFIT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "streamfit" / "preflight"


def _key(model_bytes: bytes, loss: str, optimizer: str, weights: Sequence[str] | None = None,
         freeze: Sequence[str] = (), stream: bool = False) -> str:
    """The cache key; a check on a stream's first rows is cached apart from one on synthetic rows (the rows
    themselves are not in it: the first check on a stream's rows stands for the model)."""
    import onnxruntime

    import streamfit

    h = hashlib.sha256(model_bytes)
    chosen = [] if weights is None and not freeze else [None if weights is None else list(weights), list(freeze)]
    extra = chosen + (["stream rows"] if stream else [])
    h.update(json.dumps([loss, optimizer, streamfit.__version__, onnxruntime.__version__, *extra]).encode())
    return h.hexdigest()


def check_model(model: "str | os.PathLike[str]", *, loss: str = "squared_error", optimizer: str = "sgd",
                use_cache: bool = True, timeout: float = TIMEOUT, weights: Sequence[str] | None = None,
                freeze: Sequence[str] = (), rows: "dict[str, Any] | None" = None) -> PreflightResult:
    """Run the preflight of the ONNX file ``model`` (with its external data beside it) in a subprocess;
    ``weights``/``freeze`` choose what trains, as the Trainer's; ``rows`` (model input name, or
    :data:`SINGLE`, -> array): the stream's first rows, stepped on instead of synthetic ones."""
    path = Path(model)
    model_bytes = path.read_bytes()
    sha = hashlib.sha256(model_bytes).hexdigest()
    key = _key(model_bytes, loss, optimizer, weights, freeze, stream=bool(rows))
    cached = cache_dir() / f"{key}.json"
    if use_cache and cached.is_file():
        try:
            data = json.loads(cached.read_text())
            return PreflightResult(**{**data, "notes": tuple(data.get("notes", ())), "cached": True})
        except (ValueError, TypeError):
            pass  # a damaged cache entry: check again
    spec = {"model": str(path.resolve()), "loss": loss, "optimizer": optimizer,
            "weights": None if weights is None else list(weights), "freeze": list(freeze)}
    with tempfile.TemporaryDirectory(prefix="streamfit-preflight-") as rows_dir:
        if rows:
            write_rows(rows, Path(rows_dir) / "rows.npz")
            spec["rows"] = str(Path(rows_dir) / "rows.npz")
        status, lines, stderr = _child(["run", json.dumps(spec)], timeout)
        result = _result(sha, status, lines, stderr)
        if result.signal and result.stage:
            op = _locate(spec, result.stage, timeout)
            if op:
                result = PreflightResult(**{**asdict(result), "op": op})
    if use_cache:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: v for k, v in asdict(result).items() if k != "cached"}))
        os.replace(tmp, cached)
    return result


def _child(args: list[str], timeout: float) -> tuple[int, list[dict[str, Any]], str]:
    """Run this module in a child process; its JSON lines on stdout, its exit status (negative: signal)."""
    env = dict(os.environ, PYTHONFAULTHANDLER="0")
    try:
        proc = subprocess.run([sys.executable, "-m", "streamfit._preflight", *args], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return -signal.SIGKILL, _lines(out), f"no answer within {timeout:.0f} s"
    return proc.returncode, _lines(proc.stdout), proc.stderr


def _lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _result(sha: str, status: int, lines: list[dict[str, Any]], stderr: str) -> PreflightResult:
    started = [line["stage"] for line in lines if line.get("event") == "start"]
    notes = tuple(n for line in lines if line.get("event") == "notes" for n in line["notes"])
    failed = [line for line in lines if line.get("event") == "error"]
    if failed:
        return PreflightResult(False, sha, failed[0]["stage"], failed[0]["error"], notes=notes)
    if status == 0 and any(line.get("event") == "done" for line in lines):
        return PreflightResult(True, sha, notes=notes)
    stage = started[-1] if started else "starting"
    if status < 0:
        name = signal.Signals(-status).name
        error = stderr.strip().splitlines()[-1] if status == -signal.SIGKILL and stderr.strip() else f"killed by {name}"
        return PreflightResult(False, sha, stage, error, signal=name, notes=notes)
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {status}"
    return PreflightResult(False, sha, stage, tail, notes=notes)


# -- locating the op of a crash ------------------------------------------------------------------------

def _locate(spec: dict[str, Any], stage: str, timeout: float) -> str | None:
    """Bisect the crashing stage's graph: run prefixes of its nodes (each in a child) to find the first
    node whose kernel kills the process.  None when the stage is no graph run or the crash does not recur."""
    if stage.startswith("preparing"):
        return None
    status, lines, _ = _child(["nodes", json.dumps({**spec, "stage": stage})], timeout)
    if status != 0 or not lines or "nodes" not in lines[-1]:
        return None
    nodes: list[str] = lines[-1]["nodes"]

    def crashes(k: int) -> bool:
        status, _, _ = _child(["prefix", json.dumps({**spec, "stage": stage, "upto": k})], timeout)
        return status < 0

    if not crashes(len(nodes)):
        return None
    lo, hi = 0, len(nodes)  # crashes(hi), not crashes(lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if crashes(mid):
            hi = mid
        else:
            lo = mid
    return nodes[hi - 1]


# -- the child -----------------------------------------------------------------------------------------

def _emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _parse_stage(stage: str) -> tuple[str, int | None]:
    """("fused", 64) for "fused, 64 rows"; (kind, None) for a stage that builds rather than runs."""
    kind, _, what = stage.partition(", ")
    return kind, int(what.split()[0]) if what.endswith(" rows") else None


#: ops an id input passes through on its way to the embedding table it indexes
_ID_PATH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"}


def _id_bound(model: Any, name: str) -> int | None:
    """The row count of the smallest table (an initializer read by ``Gather``) the integer input ``name``
    indexes, following it through casts and reshapes; None when it indexes none."""
    tables = {i.name: int(i.dims[0]) for i in model.graph.initializer if i.dims}
    bounds, todo, seen = [], [name], {name}
    while todo:
        tensor = todo.pop()
        for node in model.graph.node:
            if tensor not in node.input:
                continue
            if node.op_type == "Gather" and list(node.input).index(tensor) == 1 and node.input[0] in tables:
                bounds.append(tables[node.input[0]])
            elif node.op_type in _ID_PATH and node.input[0] == tensor:
                for out in node.output:
                    if out not in seen:
                        seen.add(out)
                        todo.append(out)
    return min(bounds) if bounds else None


def _synthetic_x(pm: Any, rows: int) -> Any:
    """Features like data the model expects, of its declared types and shapes (symbolic dims other than the
    batch: 3): floats standard normal; an integer input named like a mask (``attention_mask``) all ones (zeros
    would mask every position); ids uniform inside the smallest embedding table they index (else zeros).
    A dict by input name for a model with several inputs."""
    import numpy as np
    from onnx import helper

    rng = np.random.default_rng(0)

    def one(name: str) -> Any:
        vi = next(i for i in pm.model.graph.input if i.name == name)
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 3 for d in t.shape.dim][1:]
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        if dtype.kind == "f":
            return rng.standard_normal((rows, *dims)).astype(dtype)
        if dtype.kind == "b" or "mask" in name.lower():
            return np.ones((rows, *dims), dtype)
        bound = _id_bound(pm.model, name)
        return rng.integers(0, bound, (rows, *dims)).astype(dtype) if bound else np.zeros((rows, *dims), dtype)

    names = [i.name for i in getattr(pm, "inputs", ())] or [pm.input_name]
    return one(names[0]) if len(names) == 1 else {name: one(name) for name in names}


def _synthetic(trainer: Any, rows: int, stream: Any = None) -> tuple[Any, Any]:
    """Features for ``rows`` rows (the stream's first rows ``stream``, repeated to ``rows``, when given; else
    synthetic) and zero labels (valid for every loss)."""
    import numpy as np

    X = _synthetic_x(trainer.prepared, rows) if stream is None else _stream_x(trainer.prepared, stream, rows)
    if trainer.loss.integer_labels:
        return X, np.zeros(rows, np.int64)
    first = {k: v[:1] for k, v in X.items()} if isinstance(X, dict) else X[:1]
    return X, np.zeros((rows, *trainer.predict(first).shape[1:]), trainer.dtype)


#: the key of a single-input model's rows (the feature matrix) in a rows file
SINGLE = "__X__"


def write_rows(rows: "dict[str, Any]", path: "str | os.PathLike[str]") -> None:
    """Write the stream's first rows (model input name, or :data:`SINGLE`, -> array) for the child: plain
    arrays in an ``.npz``, read back without pickle."""
    import numpy as np

    arrays: dict[str, Any] = {k: np.asarray(v) for k, v in rows.items()}
    np.savez(path, **arrays)


def _read_rows(path: str | None) -> "dict[str, Any] | None":
    import numpy as np

    if not path:
        return None
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _stream_x(pm: Any, stream: "dict[str, Any]", rows: int) -> Any:
    """The stream's rows repeated (or cut) to ``rows``, as the model's declared types."""
    import numpy as np
    from onnx import helper

    def fit(name: str, a: Any) -> Any:
        vi = next(i for i in pm.model.graph.input if i.name == name)
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        return np.resize(a, (rows, *a.shape[1:])).astype(dtype)

    names = [i.name for i in getattr(pm, "inputs", ())] or [pm.input_name]
    if SINGLE in stream:
        return fit(names[0], stream[SINGLE])
    if set(names) - set(stream):
        raise ValueError(f"the stream's rows hold inputs {sorted(stream)}, the model declares {names}")
    return fit(names[0], stream[names[0]]) if len(names) == 1 else {n: fit(n, stream[n]) for n in names}


def _is_artifact(path: str) -> bool:
    import onnx

    from streamfit._engine.artifact import is_artifact

    return is_artifact(onnx.load(path, load_external_data=False))


def _kinds(spec: dict[str, Any]) -> tuple[set[str], str | None]:
    """The step strategies a preflight can run here, and a note on what it skips."""
    from streamfit._engine.common.ort_private import has_ort_training

    if _is_artifact(spec["model"]):
        return {"fused"}, "a training artifact: its fused step graphs only (no forward/backward stage)"
    if not has_ort_training():
        return {"fused"}, "no onnxruntime-training here: the fused step only (no forward/backward stage)"
    return {"fused", "forward_backward"}, None


def _chosen(spec: dict[str, Any]) -> dict[str, Any]:
    """The Trainer's ``weights``/``freeze`` of a spec (an older spec has neither)."""
    return {"weights": spec.get("weights"), "freeze": tuple(spec.get("freeze") or ())}


def _make(spec: dict[str, Any], kind: Any) -> Any:
    from streamfit._engine.trainer import Trainer

    if _is_artifact(spec["model"]):  # its loss and optimizer are compiled in (a trainer given others says so)
        return Trainer(spec["model"], step=kind, learning_rate=1e-3)
    loss = spec["loss"]
    if loss == "auto":  # as OnnxClassifier: one output column is binary
        probe = Trainer(spec["model"], **_chosen(spec))
        width = probe.predict(_synthetic_x(probe.prepared, 1)).reshape(1, -1).shape[1]
        loss = "log_loss" if width == 1 else "softmax_cross_entropy"
    return Trainer(spec["model"], loss=loss, optimizer=spec["optimizer"], step=kind, learning_rate=1e-3,
                   **_chosen(spec))


def _stage_graph(spec: dict[str, Any], stage: str) -> tuple[Any, dict[str, Any]]:
    """The graph a stage runs (the training copy of the model for a stage that builds) and synthetic feeds
    for every one of its inputs."""
    import numpy as np
    from onnx import helper

    from streamfit._engine.common.names import Names
    from streamfit._engine.prepare.model import prepare_model
    from streamfit._engine.steps.step_graphs import build_fused

    kind, rows = _parse_stage(stage)
    if rows is None:
        pm = prepare_model(spec["model"], **_chosen(spec))
        x1 = _synthetic_x(pm, 1)
        return pm.standalone_model(), x1 if isinstance(x1, dict) else {pm.input_name: x1}
    trainer = _make(spec, "fused")
    X, y = _synthetic(trainer, rows, _read_rows(spec.get("rows")))
    y_rank = trainer.predict({k: v[:1] for k, v in X.items()} if isinstance(X, dict) else X[:1]).ndim
    if kind == "fused":
        from streamfit._engine.steps.fused import FusedStep

        pm = getattr(trainer, "_train_pm", trainer.prepared)  # without the row-sparse tables, as the step runs it
        large = rows >= FusedStep.large_batch_rows
        model = (trainer.artifact.steps.get("large" if large else "small") or
                 next(iter(trainer.artifact.steps.values()))) if trainer.artifact is not None else build_fused(pm, trainer.graphs, trainer.loss, trainer.optimizer, trainer.penalty, y_rank,
                            large_batch=rows >= FusedStep.large_batch_rows, host_checks=True)
    else:
        model = trainer.graphs.gradient
    feeds: dict[str, Any] = {}
    rng = np.random.default_rng(1)
    for vi in model.graph.input:
        name = vi.name
        t = vi.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        if isinstance(X, dict) and name in X:
            feeds[name] = X[name]
        elif name == trainer.prepared.input_name:
            feeds[name] = X
        elif name in trainer.prepared.initial:
            feeds[name] = trainer.prepared.initial[name]
        elif name == Names.target:
            feeds[name] = y
        else:
            dims = [d.dim_value if d.HasField("dim_value") else rows for d in t.shape.dim]
            if Names.slot_owner(name) in trainer.prepared.initial:  # optimizer state: the weight's shape
                dims = list(trainer.prepared.initial[Names.slot_owner(name)].shape)
            feeds[name] = (rng.random(dims) * 0.1).astype(dtype) if dtype.kind == "f" else np.zeros(dims, dtype)
    return model, feeds


def _run_child(spec: dict[str, Any]) -> None:
    from streamfit._engine.prepare.model import prepare_model

    stage = "preparing the model"
    _emit(event="start", stage=stage)
    try:
        _emit(event="notes", notes=prepare_model(spec["model"], **_chosen(spec)).notes)
        trainers = {}
        first: dict[str, dict[str, Any]] = {}  # each strategy's update from the initial weights (first stage)
        kinds, skipped = _kinds(spec)
        if skipped:
            _emit(event="notes", notes=[skipped])
        fell_back: set[str] = set()  # the strategies whose fallback was said
        stream = _read_rows(spec.get("rows"))
        if stream is not None:
            _emit(event="notes", notes=[f"preflight on the stream's first {len(next(iter(stream.values())))} rows"])
        for kind, rows in STAGES:
            if kind not in kinds:
                continue
            if kind not in trainers:
                stage = f"{kind}, building the gradient"
                _emit(event="start", stage=stage)
                trainers[kind] = _make(spec, kind)
            stage = f"{kind}, {rows} rows"
            _emit(event="start", stage=stage)
            update = _run_stage(trainers[kind], kind, rows, stream, record=kind not in first, said=fell_back)
            if update is not None:
                first[kind] = {"rows": rows, "update": update}
        note = _disagreement(first)
        if note:
            _emit(event="notes", notes=[note])
    except Exception as exc:  # a Python-level failure: reported, not a crash
        _emit(event="error", stage=stage, error=f"{type(exc).__name__}: {str(exc)[:1000]}")
        return
    _emit(event="done")


#: how a ModelError of onnxruntime refusing a batch at run time begins (common/ort_errors.as_model_error)
_RUN_FAILURES = ("onnxruntime failed predicting", "onnxruntime failed running")
#: said when the fused step fails on a model the forward/backward step trains
FALLBACK_NOTE = ("a run falls back to step='forward_backward' (slower), which trains this model: the fused step "
                 "does not")


def _run_stage(trainer: Any, kind: str, rows: int, stream: Any, record: bool, said: set[str]) -> Any:
    """One step of ``rows`` rows (the stream's, else synthetic); the update of the weights when ``record``.
    A failure the inputs may cause (a non-finite step, onnxruntime refusing a shape or an index on them) is a
    warning note, not a refusal: the graphs were built, and the run's own rows may be fine."""
    import numpy as np

    from streamfit.exceptions import BadInputError, ModelError, NonFiniteError

    what = "the stream's first rows" if stream is not None else "synthetic inputs"
    before = trainer.get_weights() if record else None
    try:
        X, y = _synthetic(trainer, rows, stream)
        loss = trainer.step(X, y)
    except BadInputError as exc:  # BatchNorm1d cannot train on one row: a limit, not a failure
        if rows == 1 and "more than one value per channel" in str(exc):
            _emit(event="notes", notes=[f"{kind}, 1 row refused: {exc}"])
        else:
            _emit(event="notes", notes=[f"WARNING: {kind}, {rows} rows: {exc} on {what}"])
        return None
    except NonFiniteError as exc:  # the synthetic input's fault as much as the model's: said, not refused
        _emit(event="notes", notes=[f"WARNING: {kind}, {rows} rows: {exc} on {what} (they may not look like this "
                                    "model's data: the step graphs were built and ran)"])
        return None
    except ModelError as exc:
        if not str(exc).startswith(_RUN_FAILURES):  # the model's fault: a step that cannot be built
            raise
        _emit(event="notes", notes=[f"WARNING: {kind}, {rows} rows: {exc} on {what} (the step graphs were built; "
                                    "a batch of the run that meets the same fails with this error)"])
        return None
    if trainer.fallback and kind not in said:  # trains, in the other strategy
        said.add(kind)
        _emit(event="notes", notes=[f"WARNING: {kind}, {rows} rows: {trainer.fallback}; {FALLBACK_NOTE}"])
    if not np.isfinite(loss):
        _emit(event="notes", notes=[f"WARNING: {kind}, {rows} rows: non-finite loss {loss} on {what} (they may "
                                    "not look like this model's data)"])
        return None
    if before is None:
        return None
    after = trainer.get_weights()
    return {w: after[w] - before[w] for w in after}


def _disagreement(first: dict[str, dict[str, Any]]) -> str | None:
    """A note when the two strategies' first updates (same weights, same batch) differ: one of onnxruntime's
    two execution paths computes a wrong gradient for this model (seen: the TrainingAgent at batch 1)."""
    import numpy as np

    if len(first) < 2 or first["fused"]["rows"] != first["forward_backward"]["rows"]:
        return None
    a, b = first["fused"]["update"], first["forward_backward"]["update"]
    scale = max(float(np.abs(v).max()) for v in a.values()) or 1.0
    worst = max(a, key=lambda w: float(np.abs(a[w] - b[w]).max()))
    diff = float(np.abs(a[worst] - b[worst]).max())
    if diff <= 1e-3 * scale + 1e-9:
        return None
    return (f"WARNING: step='fused' and step='forward_backward' disagree at {first['fused']['rows']} row(s) "
            f"(weight {worst!r}: update differs by {diff:.3g}, largest update {scale:.3g}); one of them computes "
            "a wrong gradient for this model: compare with finite differences before relying on it")


def _nodes_child(spec: dict[str, Any]) -> None:
    model, _ = _stage_graph(spec, spec["stage"])
    _emit(nodes=[f"{n.op_type} (node {n.name or n.output[0]!r})" for n in model.graph.node])


def _prefix_child(spec: dict[str, Any]) -> None:
    """Run the first ``upto`` nodes of the stage's graph, fetching all their outputs (so none is pruned)."""
    import onnxruntime as ort
    from onnx import helper

    model, feeds = _stage_graph(spec, spec["stage"])
    nodes = list(model.graph.node)[: spec["upto"]]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    del model.graph.output[:]
    outs = [o for n in nodes for o in n.output if o]
    model.graph.output.extend(helper.make_empty_tensor_value_info(o) for o in outs)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    used = {i.name for i in sess.get_inputs()}
    try:
        sess.run(None, {k: v for k, v in feeds.items() if k in used})
    except Exception:  # a Python-level error is no crash
        pass


if __name__ == "__main__":
    command, payload = sys.argv[1], json.loads(sys.argv[2])
    {"run": _run_child, "nodes": _nodes_child, "prefix": _prefix_child}[command](payload)
