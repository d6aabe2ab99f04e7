"""Replay recorded step cases on whatever onnxruntime this interpreter has (plain onnxruntime, the newest one).

A *case* (written by ``tests/portable/cases.py`` under onnxruntime-training 1.19.2) is a directory:
``case.json`` (graph files, steps, tolerances), the portable step graphs (``*.onnx``), the starting weights
and optimizer state (``state.npz``), each step's other inputs (``step<i>.npz``) and what the engine reached on
1.19.2 with the original graphs (``expected.npz``).  This script runs the steps in order, feeding each
graph's ``<name>__new`` outputs back as the next step's ``<name>`` inputs, and compares the final state and
the per-step losses with 1.19.2's.  Only numpy and onnxruntime are needed (no streamfit, no
onnxruntime-training), so it runs on Python 3.13+.

    python tests/portable/run_new_ort.py CASES_DIR [--json report.json]

Exit status 0 when every case matches (float noise), 1 otherwise; the report names each mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort


def _load(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {name: data[f"a{i}"] for i, name in enumerate(names)}


def _session(path: Path, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.set_denormal_as_zero", "1")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_case(case_dir: Path, threads: int = 1) -> dict[str, Any]:
    """Replay one case; return {"case", "ok", "max_rel", "problems", "seconds"}."""
    spec = json.loads((case_dir / "case.json").read_text())
    if spec.get("kind") == "split":
        return run_split_case(case_dir, spec, threads)
    problems: list[str] = []
    try:
        sessions = {role: _session(case_dir / file, threads) for role, file in spec["graphs"].items()}
    except Exception as exc:  # a graph this build cannot load: the point of the test
        return {"case": spec["name"], "ok": False, "max_rel": None, "seconds": 0.0,
                "problems": [f"load: {type(exc).__name__}: {str(exc)[:300]}"]}
    state = _load(case_dir / "state.npz", spec["state"])
    losses = []
    t0 = time.perf_counter()
    for i, step in enumerate(spec["steps"]):
        sess = sessions[step["graph"]]
        feeds = _load(case_dir / step["file"], step["names"])
        wanted = {i.name for i in sess.get_inputs()}
        feeds.update({k: v for k, v in state.items() if k in wanted})
        missing = wanted - set(feeds)
        if missing:
            problems.append(f"step {i}: no value for inputs {sorted(missing)[:5]}")
            break
        names = [o.name for o in sess.get_outputs()]
        try:
            outputs = dict(zip(names, sess.run(names, feeds)))
        except Exception as exc:
            problems.append(f"step {i}: run: {type(exc).__name__}: {str(exc)[:300]}")
            break
        losses.append(float(outputs[spec["loss"]]))
        for name in state:
            if f"{name}__new" in outputs:
                state[name] = outputs[f"{name}__new"]
    seconds = time.perf_counter() - t0
    max_rel = 0.0
    if not problems:
        expected = _load(case_dir / "expected.npz", spec["state"])
        rtol, atol = spec["rtol"], spec["atol"]
        for name, want in expected.items():
            got = state[name]
            if got.shape != want.shape:
                problems.append(f"{name}: shape {got.shape}, expected {want.shape}")
                continue
            err = np.abs(got.astype(np.float64) - want)
            scale = atol + rtol * np.abs(want)
            max_rel = max(max_rel, float((err / scale).max()) if err.size else 0.0)
            if not np.all(err <= scale):
                problems.append(f"{name}: max |diff| {float(err.max()):.3g} beyond rtol {rtol} atol {atol}")
        want_losses = spec["losses"]
        if not np.allclose(losses, want_losses, rtol=rtol, atol=atol):
            problems.append(f"losses {losses} != 1.19.2's {want_losses}")
    return {"case": spec["name"], "ok": not problems, "max_rel": max_rel, "problems": problems, "seconds": seconds}


def _compare(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], rtol: float, atol: float,
             problems: list[str]) -> float:
    max_rel = 0.0
    for name, want in expected.items():
        value = got.get(name)
        if value is None or value.shape != want.shape:
            problems.append(f"{name}: {None if value is None else value.shape}, expected shape {want.shape}")
            continue
        err = np.abs(value.astype(np.float64) - want)
        scale = atol + rtol * np.abs(want)
        max_rel = max(max_rel, float((err / scale).max()) if err.size else 0.0)
        if not np.all(err <= scale):
            problems.append(f"{name}: max |diff| {float(err.max()):.3g} beyond rtol {rtol} atol {atol}")
    return max_rel


def run_split_case(case_dir: Path, spec: dict[str, Any], threads: int = 1) -> dict[str, Any]:
    """A forward/backward case: the forward graph, then the backward graph fed dL/dY and the stashed tensors;
    the gradients compared with the TrainingAgent's on 1.19.2."""
    problems: list[str] = []
    t0 = time.perf_counter()
    try:
        fw, bw = (_session(case_dir / spec["graphs"][k], threads) for k in ("forward", "backward"))
        feeds = _load(case_dir / "feeds.npz", spec["feeds"])
        outs = dict(zip([o.name for o in fw.get_outputs()], fw.run(None, {i.name: feeds[i.name] for i in fw.get_inputs()})))
        feeds.update(outs)
        grads = dict(zip(spec["grad_outputs"], bw.run(spec["grad_outputs"], {i.name: feeds[i.name] for i in bw.get_inputs()})))
    except Exception as exc:
        return {"case": spec["name"], "ok": False, "max_rel": None, "seconds": 0.0,
                "problems": [f"run: {type(exc).__name__}: {str(exc)[:300]}"]}
    expected = _load(case_dir / "expected.npz", spec["grad_outputs"])
    max_rel = _compare(grads, expected, spec["rtol"], spec["atol"], problems)
    return {"case": spec["name"], "ok": not problems, "max_rel": max_rel, "problems": problems,
            "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", type=Path, help="a directory of case directories (or one case directory)")
    parser.add_argument("--json", type=Path, help="write the per-case report here")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    dirs = [args.cases] if (args.cases / "case.json").is_file() else sorted(
        p for p in args.cases.iterdir() if (p / "case.json").is_file())
    if not dirs:
        print(f"no cases under {args.cases}", file=sys.stderr)
        return 2
    results = [run_case(d, args.threads) for d in dirs]
    bad = [r for r in results if not r["ok"]]
    print(f"onnxruntime {ort.__version__} (Python {sys.version.split()[0]}): {len(results) - len(bad)}/{len(results)} "
          f"cases match onnxruntime-training 1.19.2")
    for r in bad:
        print(f"  MISMATCH {r['case']}: " + "; ".join(r["problems"]))
    if args.json:
        args.json.write_text(json.dumps({"onnxruntime": ort.__version__, "results": results}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
