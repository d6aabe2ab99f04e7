"""The ``streamfit`` command: train on a finite stream, serve a never-ending one, export and inspect checkpoints.

Every failure ends with one line on stderr (a JSON log line under ``--log-json``) and exit code 2 for bad
input or configuration, 1 for a runtime failure; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

__all__ = ["main"]


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file of options (flags given on the command line win)")
    p.add_argument("--source", help="parquet:/dir, ipc:/file, ipc+tcp://127.0.0.1:PORT, kafka://HOST:PORT/topic?group=g")
    p.add_argument("--model", help="ONNX model file to train (OnnxRegressor/OnnxClassifier; not with a ready-made "
                                   "--estimator)")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every-batches", type=int)
    p.add_argument("--checkpoint-every-seconds", type=float)
    p.add_argument("--keep", type=int, help="checkpoints to keep (default 3)")
    p.add_argument("--resume", action="store_true", default=None, help="continue from the newest valid checkpoint")
    p.add_argument("--publish", help="also write the latest model here (atomically) after each checkpoint")
    p.add_argument("--publish-every", type=float,
                   help="seconds between publications at most (written in the background; default: every checkpoint)")
    p.add_argument("--full-every", type=int,
                   help="with row-sparse tables: a full checkpoint every K, deltas of touched rows between (default 10)")
    p.add_argument("--follow", action="store_true", default=None, help="keep watching a Parquet directory")
    p.add_argument("--log-json", action="store_true", default=None, help="structured JSON log lines")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1:PORT")
    p.add_argument("--health-file", help="JSON file saying when the last batch was trained")
    p.add_argument("--health-interval", type=float, help="seconds between health-file updates (default 1)")
    p.add_argument("--mlflow", metavar="URI", help="log the run's parameters and metrics history to this MLflow "
                   "tracking URI while it goes (each interval as it is written), its model at the end (extra [mlflow])")
    p.add_argument("--tensorboard", metavar="DIR", help="write the run's metrics history as TensorBoard scalars in DIR "
                   "while it goes (each interval as it is written; extra [tensorboard])")
    p.add_argument("--no-check", dest="check", action="store_false", default=None,
                   help="skip the preflight (a model not checked before is run in a subprocess first)")
    from streamfit._stream.options import add_option_flags
    from streamfit.daemon.model_options import add_model_flags

    add_model_flags(p.add_argument_group("the estimator: its class's constructor parameters "
                                         "(streamfit.daemon.ModelOptions; also the config file's keys)"),
                    p.add_argument_group("the optimizer's constructor parameters, as OPTIMIZER-PARAM (with --optimizer "
                                         "OPTIMIZER; config keys optimizer_param)"))
    what = "(streamfit.StreamOptions; also the config file's keys)"
    add_option_flags(p, {"loop": p.add_argument_group(f"the stream {what}"),
                         "history": p.add_argument_group(f"the metrics history {what}"),
                         "daemon": p.add_argument_group(f"the divergence guard {what}"),
                         "ray": p.add_argument_group(f"scale-out on Ray, extra [ray] {what}")})


class _UsageError(Exception):
    """A command line argparse refuses (reported as a configuration error, exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors become one line (and exit code 2) like every other failure."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        if message.startswith("unrecognized arguments: "):
            import difflib

            def flags_of(parser: argparse.ArgumentParser) -> list[str]:
                out = []
                for action in parser._actions:
                    out += [s for s in action.option_strings if s.startswith("--")]
                    if isinstance(action, argparse._SubParsersAction):
                        for sub in action.choices.values():
                            out += flags_of(sub)
                return out

            flags = sorted(set(flags_of(self)))
            for arg in message[len("unrecognized arguments: "):].split():
                near = difflib.get_close_matches(arg.split("=")[0], flags, n=1, cutoff=0.6)
                if arg.startswith("--") and near:
                    raise _UsageError(f"unknown option {arg} (did you mean {near[0]}?) (see {self.prog} --help)")
        raise _UsageError(f"{message} (see {self.prog} --help)")


def _parser() -> argparse.ArgumentParser:
    from streamfit.optim import _BY_NAME as _OPTIMIZERS

    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", help="print the full traceback of a failure")
    parser = _Parser(prog="streamfit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub_add = sub.add_parser

    def add(name: str, **kw: Any) -> _Parser:
        return sub_add(name, parents=[common], **kw)

    sub.add_parser = add  # type: ignore[method-assign, assignment]
    train = sub.add_parser("train", help="train on a finite stream, then checkpoint and export the model")
    train.add_argument("--demo", action="store_true", help="train on a small generated Parquet stream")
    train.add_argument("--demo-dir", default="streamfit-demo", help="where --demo writes its data and results")
    train.add_argument("-o", "--output", help="write the trained ONNX model here")
    _run_options(train)
    serve = sub.add_parser("serve", help="train until SIGTERM/SIGINT, with checkpoints and exact resume")
    _run_options(serve)
    export = sub.add_parser("export", help="write the ONNX model of a checkpoint")
    export.add_argument("checkpoint", help="a checkpoint directory, or a checkpoint root (its newest valid one)")
    export.add_argument("-o", "--output", required=True)
    _add_check(sub, sorted(_OPTIMIZERS))
    _add_compile(sub, sorted(_OPTIMIZERS))
    _add_report(sub)
    inspect = sub.add_parser("inspect", help="describe a checkpoint in words")
    inspect.add_argument("checkpoint")
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    return parser


def _add_check(sub: Any, optimizers: list[str]) -> None:
    """``streamfit check MODEL``: the arguments."""
    check = sub.add_parser("check", help="build both step graphs and run one step of each batch-size class in "
                                         "a subprocess: refuses a model that would crash the trainer")
    check.add_argument("model", help="ONNX model file")
    check.add_argument("--task", choices=["regression", "classification"], default="regression")
    check.add_argument("--loss", help="default: squared_error, or by output width for classification")
    check.add_argument("--optimizer", default="sgd", choices=optimizers)
    check.add_argument("--no-cache", action="store_true", help="check again even if the result is cached")
    check.add_argument("--weights", help="comma-separated initializers to train (default: every float weight but "
                                         "the constants of the rule)")
    check.add_argument("--freeze", help="comma-separated initializers to keep out of training, as train --freeze")


def _add_compile(sub: Any, optimizers: list[str]) -> None:
    """``streamfit compile MODEL -o ARTIFACT``: the arguments (the Trainer's, of the graphs to build)."""
    comp = sub.add_parser("compile", help="build a model's step graphs into a training artifact that any "
                          "onnxruntime >= 1.19 trains (needs a gradient builder: onnxruntime-training, Python <= 3.12, "
                          "or a ready-made model's ops)")
    comp.add_argument("model", help="ONNX model file")
    comp.add_argument("-o", "--output", required=True, help="the artifact to write (e.g. model.train.onnx)")
    comp.add_argument("--loss", default="squared_error")
    comp.add_argument("--optimizer", default="sgd", choices=optimizers)
    comp.add_argument("--momentum", type=float, help="momentum of --optimizer momentum/nesterov")
    comp.add_argument("--penalty", choices=["l2", "l1", "elasticnet", "none"], default="none")
    comp.add_argument("--alpha", type=float, default=1e-4, help="penalty strength (default 1e-4)")
    comp.add_argument("--l1-ratio", type=float, default=0.15, help="elasticnet mix (default 0.15)")
    comp.add_argument("--batch-classes", default="small,large",
                      help="step graphs to build: small (< 64 rows), large, or both (default small,large); "
                           "one class alone serves every batch size")
    comp.add_argument("--weights", help="comma-separated initializers to train (default: every float weight)")
    comp.add_argument("--input-name")
    comp.add_argument("--output-name")
    comp.add_argument("--device", default="cpu", help="cpu or cuda[:N]: the device the artifact will train on")
    comp.add_argument("--freeze-batchnorm", action="store_true")
    comp.add_argument("--gradient", choices=["auto", "onnxruntime", "streamfit"], default="auto",
                      help="gradient builder: onnxruntime-training's (any op it knows), streamfit's own (the ready-made "
                           "models' ops), auto: the first where installed")


def _add_report(sub: Any) -> None:
    """``streamfit report CHECKPOINT_DIR``: the arguments."""
    report = sub.add_parser("report", help="draw a run's metrics history: one self-contained HTML page (and PNGs)")
    report.add_argument("checkpoint_dir", help="the run's checkpoint directory (holding history/)")
    report.add_argument("-o", "--output", help="the HTML page to write (default CHECKPOINT_DIR/report.html)")
    report.add_argument("--png", metavar="DIR", help="also write each plot as a PNG file in DIR")
    report.add_argument("--mlflow", metavar="URI", help="log the run's parameters, metrics history and model to "
                        "this MLflow tracking URI (extra [mlflow])")
    report.add_argument("--tensorboard", metavar="DIR", help="write the metrics history as TensorBoard scalars "
                        "in DIR (extra [tensorboard])")


_logging_json: bool | None = None  # how the "streamfit" logger was set up (None: not yet)


def _setup_logging(json_lines: bool) -> None:
    global _logging_json
    from streamfit.daemon.health import JsonFormatter

    _logging_json = json_lines

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("streamfit")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def _config(ns: argparse.Namespace) -> Any:
    from streamfit.daemon.config import load_config

    cfg = load_config(ns.config, dict(vars(ns)))
    ns.log_json = cfg.log_json  # a failure from here on is reported as the run logs
    return cfg


def _is_file_source(source: str) -> bool:
    """A source whose first rows can be read ahead without taking them from anyone (files: not Kafka, whose
    group it would join, nor a socket or stdin)."""
    lower = source.lower()
    if lower.startswith(("kafka://", "ipc+tcp://")) or lower in ("ipc:-", "-"):
        return False
    return lower.startswith(("parquet:", "ipc:")) or Path(source).exists()


def _first_rows(cfg: Any, rows: int = 64) -> dict[str, Any] | None:
    """The stream's first ``rows`` good rows as the model's inputs (name, or the preflight's ``SINGLE`` for the
    feature matrix, -> array), read ahead from a file source through the run's column plan for the preflight;
    None (synthetic rows then) for a live source, or rows it cannot read or hand over as plain numbers."""
    import anyio
    import numpy as np

    from streamfit._preflight import SINGLE
    from streamfit._stream.loop import StreamLoop
    from streamfit.daemon.config import build_estimator
    from streamfit.sources.uri import open_source

    if not _is_file_source(cfg.source):
        return None
    log = logging.getLogger("streamfit.daemon")

    async def first() -> Any:
        loop = StreamLoop(build_estimator(cfg), None, replace(cfg.stream, batch_size=rows, on_bad="skip",
                                                                progress=False, max_rows=rows, inputs=None,
                                                                history_dir=None, dead_letter=None))
        source = open_source(cfg.source, **{k: v for k, v in cfg.source_options.items() if k != "follow"})
        try:
            with anyio.move_on_after(10):
                async for sb in source:
                    for tb in loop.rebatcher.push(sb):
                        return tb
            return next(iter(loop.rebatcher.flush()), None)
        finally:
            await source.aclose()

    was = logging.root.manager.disable
    logging.disable(logging.WARNING)  # a preview: the run itself logs its columns, skipped rows and source
    try:
        tb = anyio.run(first)
    except Exception as exc:  # the run itself reports what is wrong with the source or its columns
        logging.disable(was)
        log.debug("preflight: the stream's first rows could not be read ahead (%s): synthetic rows", exc)
        return None
    finally:
        logging.disable(was)
    if tb is None or tb.n_rows == 0:
        return None
    arrays = dict(tb.X) if isinstance(tb.X, dict) else {SINGLE: tb.X}
    out = {k: np.array(v) for k, v in arrays.items()}
    return out if all(a.dtype.kind in "fiub" for a in out.values()) else None


def _preflight(model: str, task: str, loss: str | None, optimizer: str, use_cache: bool = True,
               weights: Sequence[str] | None = None, freeze: Sequence[str] = (),
               rows: dict[str, Any] | None = None) -> Any:
    from streamfit._preflight import check_model

    if not Path(model).is_file():
        raise ValueError(f"model file {model!r} not found")
    loss = loss or ("auto" if task == "classification" else "squared_error")
    return check_model(model, loss=loss, optimizer=optimizer, use_cache=use_cache, weights=weights, freeze=freeze,
                       rows=rows)


def _check(ns: argparse.Namespace) -> int:
    weights, freeze = _names(ns.weights), _names(ns.freeze) or ()
    result = _preflight(ns.model, ns.task, ns.loss, ns.optimizer, use_cache=not ns.no_cache, weights=weights,
                        freeze=freeze)
    print(result.message() + (" (cached)" if result.cached else ""))
    for note in result.notes:
        print(f"  {note}")
    for line in _weight_report(ns.model, weights, freeze):
        print(f"  {line}")
    return 0 if result.ok else 2  # a refused model is bad input, as train/serve report it (ModelError)


def _names(text: str | None) -> list[str] | None:
    """``--weights a,b`` -> ["a", "b"]; None when not given."""
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def _weight_report(model: str, weights: Sequence[str] | None = None, freeze: Sequence[str] = ()) -> list[str]:
    """Which gradient builders differentiate the model, which initializers train, which are constants and why,
    what the exporter made (none for a model that cannot be prepared: the preflight said why)."""
    from streamfit._engine.prepare.constants import weight_report
    from streamfit._engine.prepare.model import prepare_model
    from streamfit.exceptions import StreamfitError

    from streamfit._engine.gradient.autodiff import builders_note

    try:
        pm = prepare_model(model, weights, freeze=freeze)
    except StreamfitError:
        return []
    source = pm.inference if pm.inference is not None else pm.model
    return [builders_note(pm)] + weight_report(source.graph.initializer, pm.weights, pm.constants)


def _checkpoint_weight_report(ckpt: Any) -> list[str]:
    """``_weight_report`` of a checkpoint's model: from the stamp ``to_onnx()`` wrote, else (a checkpoint written
    before the stamp) the trainer's saved weights, the others constants by the rule or left out by the run."""
    import onnx

    from streamfit._engine.prepare.constants import constant_reason, trained_set_of, weight_report

    try:
        model = onnx.load_from_string(ckpt.model_bytes)
    except Exception:  # a model onnx cannot parse: the rest of inspect still says what it can
        return []
    stamp = trained_set_of(model)
    if stamp is not None:
        return weight_report(model.graph.initializer, stamp.weights, stamp.constants)
    trainer = (ckpt.meta.get("estimator") or {}).get("state", {}).get("trainer", {})
    weights = [w for w in trainer.get("weights", {}) if isinstance(w, str)]
    if not weights:
        return []
    uses: dict[str, list[tuple[str, int]]] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            uses.setdefault(name, []).append((node.op_type, i))
    reasons = {i.name: constant_reason(i, uses.get(i.name, ())) or "not trained by this run (weights=, freeze=, "
               "or it does not reach the output)" for i in model.graph.initializer if i.name not in weights}
    return weight_report(model.graph.initializer, weights, reasons)


def _compile(ns: argparse.Namespace) -> int:
    from streamfit._engine.artifact import read_artifact, save_artifact
    from streamfit._engine.compile import compile_artifact
    from streamfit.exceptions import ConfigError
    from streamfit.penalties import get_penalty

    if not os.path.exists(ns.model):
        raise ConfigError(f"model file {ns.model!r} not found")
    classes = [c.strip() for c in ns.batch_classes.split(",") if c.strip()]
    opt_params = {"momentum": ns.momentum} if ns.momentum is not None else {}
    if opt_params and ns.optimizer not in ("momentum", "nesterov"):
        raise ConfigError(f"--momentum applies to --optimizer momentum or nesterov, not {ns.optimizer}")
    try:
        from streamfit.optim import get_optimizer

        optimizer = get_optimizer(ns.optimizer, **opt_params)
        penalty = get_penalty(None if ns.penalty == "none" else ns.penalty, ns.alpha, ns.l1_ratio)
        artifact = compile_artifact(ns.model, loss=ns.loss, optimizer=optimizer, penalty=penalty,
                                    batch_classes=classes, device=ns.device, freeze_batchnorm=ns.freeze_batchnorm,
                                    weights=ns.weights.split(",") if ns.weights else None,
                                    input_name=ns.input_name, output_name=ns.output_name, gradient=ns.gradient)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    save_artifact(artifact, ns.output)
    info = read_artifact(artifact).info
    print(f"wrote {ns.output}: {len(info.weights)} trained weights, step graphs for "
          f"{', '.join(g.batch_class for g in info.graphs)} batches; {info.describe_training()}")
    return 0


def _prepare(ns: argparse.Namespace, serve: bool) -> tuple[Any, Any]:
    """Configuration, logging and the runner; what fails here is the configuration's fault (exit 2)."""
    from streamfit.exceptions import ConfigError, StreamfitError

    try:
        cfg = _config(ns)
        _setup_logging(cfg.log_json)
        _batch_wait(cfg, serve)
        return cfg, (None if cfg.workers is not None else _runner(cfg, serve=serve))
    except (ValueError, TypeError, OSError) as exc:
        if isinstance(exc, StreamfitError):
            raise
        raise ConfigError(str(exc)) from exc


def _batch_wait(cfg: Any, serve: bool) -> None:
    """``serve`` trains a quiet live stream's partial batch after ``SERVE_MAX_BATCH_WAIT`` s unless told otherwise;
    ``train`` keeps the end-of-stream rule (batch boundaries that depend on the data alone).  Scale-out on Ray
    has no partial batch between its synchronization rounds."""
    import math

    from streamfit._stream.options import SERVE_MAX_BATCH_WAIT
    from streamfit.exceptions import ConfigError

    wait = cfg.stream.max_batch_wait
    if cfg.workers is not None:
        if wait is not None and not math.isinf(wait):
            raise ConfigError(f"max_batch_wait = {wait:g} is not supported with workers = {cfg.workers} (scale-out "
                              "on Ray): a learner trains a partial batch only at the end of its share")
        return
    if serve and wait is None and not cfg.stream.drop_last:
        cfg.stream = replace(cfg.stream, max_batch_wait=SERVE_MAX_BATCH_WAIT)


def _runner(cfg: Any, serve: bool) -> Any:
    from streamfit.daemon import Runner
    from streamfit.daemon.config import build_estimator
    from streamfit.daemon.health import Metrics
    from streamfit.exceptions import ConfigError

    if cfg.source is None:
        raise ConfigError("no source given: --source URI (or 'source = ...' in the config file)")
    if cfg.check and cfg.model is not None and cfg.estimator.startswith("Onnx"):  # a crashing model never starts
        from streamfit.exceptions import ModelError

        freeze = cfg.estimator_options.value("freeze", cfg.task) or ()  # --freeze: the steps the run will take
        result = _preflight(cfg.model, cfg.task, cfg.loss, cfg.optimizer, freeze=freeze, rows=_first_rows(cfg))
        if not result.ok:
            raise ModelError(result.message())
        log = logging.getLogger("streamfit.daemon")
        log.debug("%s%s", result.message(), " (cached)" if result.cached else "")
        for note in result.notes:
            if note.startswith("WARNING"):
                log.warning("preflight: %s", note)
    source_options = dict(cfg.source_options)
    if cfg.follow or (serve and cfg.source.startswith("parquet:")):
        source_options.setdefault("follow", True)
    metrics = Metrics(cfg.metrics_port) if cfg.metrics_port is not None else None
    return Runner(build_estimator(cfg), cfg.source, checkpoint_dir=cfg.checkpoint_dir,
                  every_batches=cfg.checkpoint_every_batches, every_seconds=cfg.checkpoint_every_seconds,
                  keep=cfg.keep, resume=cfg.resume, publish_path=cfg.publish,
                  full_every=cfg.full_every, publish_every=cfg.publish_every,
                  health_path=cfg.health_file, health_interval=cfg.health_interval, metrics=metrics, source_options=source_options,
                  trackers=_trackers(cfg),
                  # the estimator holds the inputs (build_estimator gave it cfg.stream.inputs); serve draws no bar
                  options=replace(cfg.stream, inputs=None, progress=cfg.stream.progress and not serve, task=cfg.task))


def _print_summary(summary: Any, output: str | None) -> None:
    metrics = summary.metrics.get("stream", {}) if summary.metrics else {}
    shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, float))
    print(f"trained {summary.rows} rows in {summary.batches} batches ({summary.rows_per_s:,.0f} rows/s)"
          + (f"; progressive {shown}" if shown else ""))
    if summary.skipped_rows:
        print(f"skipped rows: {summary.skipped_rows}")
    if summary.skipped_messages:
        print(f"skipped messages: {summary.skipped_messages}")
    if summary.rollbacks:
        print(f"divergence rollbacks: {summary.rollbacks}")
    if summary.last_checkpoint:
        print(f"checkpoint: {summary.last_checkpoint}")
    if output:
        print(f"model written to {output}")


def _check_trained(summary: Any, finite: bool) -> None:
    """Refuse to call a run that trained nothing a success: every row skipped, or (``train``) no row at all."""
    from streamfit.exceptions import BadInputError

    if summary.rows_this_run > 0 or summary.ended_by == "max_rows":
        return
    skipped = summary.skipped_this_run or summary.skipped_read  # a stopped serve: skipped after its position
    # whole messages without rows to count (undecodable, empty); a column problem counts its rows already
    messages = {r: n for r, n in summary.messages_skipped_read.items() if r not in skipped}

    def by_reason(counts: dict[str, int]) -> str:
        return ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1]))

    if skipped or messages:
        what = [f"all {sum(skipped.values())} rows read were skipped ({by_reason(skipped)})"] if skipped else []
        if messages:
            n = sum(messages.values())
            what.append(f"{n} whole message{'s' if n > 1 else ''} or file{'s' if n > 1 else ''} "
                        f"{'were' if n > 1 else 'was'} skipped ({by_reason(messages)})")
        raise BadInputError(f"no row trained: {' and '.join(what)} by --on-bad skip; the skipped_input log lines "
                            "say where", reason="all_skipped")
    if finite and summary.rows == 0:
        raise BadInputError("no row trained: the source held no rows", reason="no_rows")


def _train(ns: argparse.Namespace) -> int:
    import anyio
    import onnx

    if ns.demo:
        from streamfit.daemon.demo import make_demo

        root = Path(ns.demo_dir)
        data, model = make_demo(root)
        if not ns.resume and (root / "checkpoints").exists():
            import shutil

            shutil.rmtree(root / "checkpoints")  # the demo's own directory: start afresh
        ns.source = ns.source or f"parquet:{data}"
        ns.model = ns.model or str(model)
        ns.checkpoint_dir = ns.checkpoint_dir or str(root / "checkpoints")
        ns.output = ns.output or str(root / "model.onnx")
        ns.optimizer = ns.optimizer or "adam"
        ns.learning_rate = ns.learning_rate or "constant"
        ns.eta0 = ns.eta0 if ns.eta0 is not None else 1e-3
        ns.penalty = ns.penalty or "none"
        ns.batch_size = ns.batch_size or 128
        ns.history_every_rows = ns.history_every_rows or 2000  # 20 intervals of the 40,000 rows
        print(f"demo: {data} (4 Parquet files, 40,000 rows), model {model}")
    cfg, runner = _prepare(ns, serve=False)
    if runner is None:  # --workers N: the learners run on Ray
        from streamfit.distributed._cli import run_distributed

        run_distributed(cfg, serve=False, preflight=_preflight, trackers=_trackers(cfg))
        return 0
    summary = anyio.run(runner.run)
    _check_trained(summary, finite=True)
    if cfg.output:
        Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
        onnx.save(runner.estimator.to_onnx(), cfg.output)
    _print_summary(summary, cfg.output)
    _track(runner)
    return 0


def _serve(ns: argparse.Namespace) -> int:
    import anyio

    from streamfit.daemon.signals import STOP_SIGNALS, signals_handled

    came: list[int] = []  # SIGTERM/SIGINT during start-up (the preflight, a resume): recorded, not fatal
    with signals_handled(lambda signum, frame: came.append(signum)):
        cfg, runner = _prepare(ns, serve=True)
    if came:  # told to stop before the first batch: nothing trained, nothing to save
        logging.getLogger("streamfit.daemon").info(
            "signal %s during start-up: stopping before the first batch (nothing trained)",
            signal.Signals(came[0]).name)
        return 0
    if runner is None:  # --workers N: the learners run on Ray
        from streamfit.distributed._cli import run_distributed

        run_distributed(cfg, serve=True, preflight=_preflight, trackers=_trackers(cfg))
        return 0

    async def main() -> Any:
        stop = anyio.Event()

        async def watch_signals(scope: anyio.CancelScope) -> None:
            with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
                async for signum in signals:
                    if stop.is_set():  # a second signal: leave at once
                        os._exit(128 + signum)
                    logging.getLogger("streamfit.daemon").info(
                        "signal %s: finishing the current batch, then a final checkpoint", signal.Signals(signum).name)
                    stop.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_signals, tg.cancel_scope)
            summary = await runner.run(stop)
            tg.cancel_scope.cancel()
        return summary

    summary = anyio.run(main)
    _check_trained(summary, finite=False)
    _print_summary(summary, None)
    _track(runner)
    return 0


def _open_checkpoint(path: str) -> Any:
    from streamfit.checkpoint import CheckpointStore
    from streamfit.exceptions import ConfigError

    p = Path(path)
    if (p / "manifest.json").exists():
        return CheckpointStore(p.parent).load(p)
    ckpt = CheckpointStore(p).load_latest()
    if ckpt is None:
        raise ConfigError(f"{path}: no valid checkpoint here")
    return ckpt


def _export(ns: argparse.Namespace) -> int:
    from streamfit.checkpoint import publish

    ckpt = _open_checkpoint(ns.checkpoint)
    publish(ckpt.model_bytes, ns.output)
    print(f"model of {ckpt.path.name} ({ckpt.meta.get('rows', '?')} rows trained) written to {ns.output}")
    return 0


def _inspect(ns: argparse.Namespace) -> int:
    from streamfit.checkpoint import CheckpointStore

    ckpt = _open_checkpoint(ns.checkpoint)
    if ns.json:
        print(json.dumps(ckpt.manifest, indent=2, default=str))
        return 0
    meta = ckpt.meta
    est = meta.get("estimator", {})
    trainer = est.get("state", {}).get("trainer", {})
    print(f"checkpoint {ckpt.path}")
    print(f"  written {ckpt.manifest.get('created_at', '?')} by streamfit {ckpt.manifest.get('streamfit_version', '?')}"
          f" (format {ckpt.manifest.get('format_version', '?')})")
    print(f"  estimator {est.get('class', '?')}: {meta.get('rows', '?')} rows in {meta.get('batches', '?')} batches, "
          f"{trainer.get('n_steps', '?')} optimizer steps, learning-rate scale {trainer.get('lr_scale', 1.0)}")
    schedule = trainer.get("schedule", {})
    if schedule:
        print(f"  schedule {schedule.get('name', '?')} at step {schedule.get('t', '?')}")
    print(f"  resumes the source at {json.dumps(meta.get('position'))}")
    for scope, values in (meta.get("metrics") or {}).items():
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
        print(f"  progressive metrics ({scope}): {shown}")
    if meta.get("skipped_rows"):
        print(f"  skipped rows by reason: {meta['skipped_rows']}")
    if meta.get("skipped_messages"):
        print(f"  skipped messages by reason: {meta['skipped_messages']}")
    quarantined = (meta.get("poison") or {}).get("quarantined")
    if quarantined:
        print(f"  poison messages quarantined: {', '.join(quarantined)}")
    rows = (meta.get("poison") or {}).get("quarantined_rows")
    if rows:
        shown = "; ".join(f"row {json.dumps(r.get('row'))} of message {r.get('message')}" for r in rows[:10])
        print(f"  poison rows quarantined ({len(rows)}): {shown}{' ...' if len(rows) > 10 else ''}")
    if meta.get("rollbacks"):
        print(f"  divergence rollbacks so far: {meta['rollbacks']}")
    for line in _checkpoint_weight_report(ckpt):
        print(f"  {line}")
    arrays = sorted(ckpt.arrays)
    print(f"  {len(arrays)} arrays: {', '.join(arrays[:8])}{' ...' if len(arrays) > 8 else ''}")
    if ckpt.manifest.get("format_version") == 1:
        print("  format 1: its manifest has no checksum (the data files are verified, the manifest cannot be)")
    aside = CheckpointStore(ckpt.path.parent).list_corrupt()
    if aside:
        print(f"  set aside as corrupt (kept for a post-mortem): {', '.join(p.name for p in aside)}")
    return 0


def _trackers(cfg: Any) -> list[Any]:
    """The trackers asked for (``--mlflow``, ``--tensorboard``): they log the run's history as it is written."""
    if (cfg.mlflow or cfg.tensorboard) and cfg.checkpoint_dir is None and cfg.stream.history_dir is None:
        from streamfit.exceptions import ConfigError

        raise ConfigError("--mlflow/--tensorboard log the run's metrics history, kept in --checkpoint-dir (or "
                          "--history-dir): give one")
    out: list[Any] = []
    if cfg.mlflow:
        from streamfit.report.trackers import MlflowTracker

        out.append(MlflowTracker(cfg.mlflow, checkpoint_dir=cfg.checkpoint_dir))
    if cfg.tensorboard:
        from streamfit.report.trackers import TensorBoardTracker

        out.append(TensorBoardTracker(cfg.tensorboard))
    return out


def _track(runner: Any) -> None:
    """After a run: where its trackers logged it (``--mlflow``: the MLflow run id; ``--tensorboard``: the dir)."""
    for tracker in runner.trackers:
        print(tracker.summary())


def _report_command(ns: argparse.Namespace) -> int:
    from streamfit.exceptions import ConfigError

    root = Path(ns.checkpoint_dir)
    if not root.is_dir():
        raise ConfigError(f"{root}: no such checkpoint directory")
    did = False
    if ns.output or ns.png or not (ns.mlflow or ns.tensorboard):
        from streamfit.report import write_report

        out = Path(ns.output) if ns.output else root / "report.html"
        written = write_report(root, out, png_dir=ns.png)
        print(f"report written to {out} ({len(written.plots)} plots" +
              (f"; PNGs in {ns.png}" if ns.png else "") + ")")
        did = True
    if ns.mlflow:
        from streamfit.report.trackers import log_mlflow

        print(f"mlflow: {log_mlflow(root, ns.mlflow)}")
    if ns.tensorboard:
        from streamfit.report.trackers import write_tensorboard

        print(f"tensorboard: {write_tensorboard(root, ns.tensorboard)}")
    return 0 if did or ns.mlflow or ns.tensorboard else 2


def _report(failure: Any, command: str, exc: BaseException, json_lines: bool, debug: bool) -> None:
    """One line on stderr, or one JSON log line; the traceback first with ``--debug``."""
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    line = failure.line(command)
    if not json_lines:
        print(line, file=sys.stderr, flush=True)
        return
    from streamfit.daemon.health import log_event

    if _logging_json is not True:
        _setup_logging(True)
    log_event("error", line, level=logging.ERROR, command=command, exit_code=failure.exit_code, kind=failure.kind,
              **failure.fields)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``streamfit`` command; return its exit code (0 ok, 1 runtime failure, 2 bad input/configuration)."""
    from streamfit.daemon.failure import describe
    from streamfit.exceptions import ConfigError

    global _logging_json
    _logging_json = None
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {"train": _train, "serve": _serve, "export": _export, "inspect": _inspect, "check": _check,
                "compile": _compile, "report": _report_command}
    ns: argparse.Namespace | None = None
    try:
        ns = _parser().parse_args(args)
        return commands[ns.command](ns)
    except BaseException as exc:
        if isinstance(exc, SystemExit):  # --help
            raise
        if isinstance(exc, _UsageError):
            exc = ConfigError(str(exc))
        command = ns.command if ns is not None else next((a for a in args if a in commands), "")
        json_lines = bool(getattr(ns, "log_json", None)) if ns is not None else "--log-json" in args
        debug = bool(getattr(ns, "debug", False)) if ns is not None else "--debug" in args
        failure = describe(exc)
        _report(failure, command, exc, json_lines, debug)
        return failure.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
