"""Plots of the benches' JSON output for the documentation (docs/benchmarks/): PNGs and a generated summary.

    python bench/engine.py --json docs/benchmarks/data/engine.json
    python bench/pipeline.py --json docs/benchmarks/data/pipeline.json
    python bench/op_census.py --json docs/benchmarks/data/op_census.json
    python bench/river_defaults.py --json docs/benchmarks/data/river_defaults.json
    python bench/chunk_steps.py --json docs/benchmarks/data/chunk_steps.json
    python bench/sparse.py --json docs/benchmarks/data/sparse.json
    python bench/perrow.py --json docs/benchmarks/data/perrow.json
    python bench/inputs.py --json docs/benchmarks/data/inputs.json
    python bench/bigtable.py --json docs/benchmarks/data/bigtable.json
    python bench/columns.py --json docs/benchmarks/data/columns.json
    python bench/primitives.py --json docs/benchmarks/data/primitives.json
    python bench/ort_versions.py --new-python PYTHON --json docs/benchmarks/data/ort_versions.json
    python bench/profile_step.py --json docs/benchmarks/data/profile_step.json
    python bench/message_path.py --json docs/benchmarks/data/message_path.json
    python bench/checkpoint.py --rounds 3 --seconds 6 --json docs/benchmarks/data/checkpoint.json
    python bench/hashing.py --rounds 3 --rows 4096 --json docs/benchmarks/data/hashing.json
    python bench/soak.py --duration 75 --json docs/benchmarks/data/soak.json
    python bench/scaleout.py --json docs/benchmarks/data/scaleout.json
    python bench/plots.py --record NAME ...    # once after a run: note its date and CPU in data/runs.json
    python bench/plots.py                      # reads docs/benchmarks/data/*.json, writes the PNGs and _figures.md

Every figure says the CPU, the load average and the date of the run it comes from (``runs.json``: the date and
CPU of each JSON, recorded on the machine that ran it, so the output does not depend on where it is drawn); a
bench whose JSON is missing is listed as such. Nothing here measures: it only draws what the benches wrote.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = ROOT / "docs" / "benchmarks" / "data"
OUT = ROOT / "docs" / "benchmarks"
sys.path.insert(0, str(HERE))

from _cpu import cpu_model  # noqa: E402

ENGINE_PATHS = ("fused", "pfit", "fb", "ortapi", "torch", "sklearn")
#: the benches drawn, in the order of the page (each bench's JSON is docs/benchmarks/data/NAME.json)
BENCHES = ("engine", "pipeline", "op_census", "river_defaults", "inputs", "perrow", "chunk_steps", "sparse", "bigtable",
           "columns", "primitives", "ort_versions", "profile_step",
           "message_path", "checkpoint", "hashing", "soak", "scaleout")
PIPELINE_SERIES = (("read", "source read + to numpy"), ("mlp:memory", "MLP in memory"), ("mlp:loop", "MLP loop"),
                   ("linear:memory", "linear in memory"), ("linear:loop", "linear loop"))


def _runs(data: Path) -> dict[str, dict[str, str]]:
    path = data / "runs.json"
    return json.loads(path.read_text()) if path.exists() else {}


def record(data: Path, names: list[str]) -> None:
    """Note the date (the JSON's modification time) and this machine's CPU for each named bench's JSON."""
    runs = _runs(data)
    for name in names:
        path = data / f"{name}.json"
        when = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).strftime("%Y-%m-%d")
        runs[name] = {"date": when, "cpu": cpu_model(), "cores": str(os.cpu_count())}
    (data / "runs.json").write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")


def _load(values: Any) -> str:
    return "/".join(f"{x:.1f}" for x in values) if values else "?"


def _bars(ax: Any, groups: list[str], series: dict[str, list[float | None]], ylabel: str, log: bool = True) -> None:
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v if v is not None else 0 for v in values], width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20, ha="right")
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=3)


def engine(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    labels = doc["config"]["labels"]
    cases = doc["cases"]
    paths = [p for p in ENGINE_PATHS if any(p in c["paths"] for c in cases)]
    groups = [f"{c['model']} bs={c['batch']}" for c in cases]
    series = {labels.get(p, p): [c["paths"].get(p, {}).get("rows_per_s") for c in cases] for p in paths}
    env = doc["env"]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    _bars(ax, groups, series, "rows/s (log)")
    ax.set_title(f"bench/engine.py: rows/s per training step path\n{cpu}, {env.get('cpu_count', '?')} cores, "
                 f"load {_load(env.get('loadavg_start'))} at start, {when}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "engine.png", dpi=90)
    plt.close(fig)
    lines = ["| case | " + " | ".join(labels.get(p, p) for p in paths) + " |",
             "|---|" + "---|" * len(paths)]
    for c, g in zip(cases, groups):
        cells = []
        for p in paths:
            v = c["paths"].get(p)
            cells.append("n/a" if v is None else (f"{v['us_per_step']:.1f} us" if c["batch"] == 1
                                                   else f"{v['rows_per_s'] / 1e3:,.0f}K rows/s"))
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    return lines


def _median(samples: list[dict[str, Any]]) -> float | None:
    rates = [s.get("end_to_end") or s["rows"] / s["seconds"] for s in samples if s.get("seconds")]
    return statistics.median(rates) if rates else None


def pipeline(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    cases = doc["cases"]
    groups = [f"{c['source']}/{c['layout']}" + ("" if c.get("variant") in (None, "default") else f" {c['variant']}")
              for c in cases]
    series = {label: [_median(c["samples"].get(key, [])) for c in cases] for key, label in PIPELINE_SERIES}
    fig, ax = plt.subplots(figsize=(10, 4.8))
    _bars(ax, groups, series, "rows/s (log)")
    ax.set_title(f"bench/pipeline.py: the stream loop beside in-memory training and the bare read (batch "
                 f"{doc['args'].get('batch')})\n{cpu}, {when}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "pipeline.png", dpi=90)
    plt.close(fig)
    lines = ["| source | " + " | ".join(label for _, label in PIPELINE_SERIES) + " | MLP loop / memory |",
             "|---|" + "---|" * (len(PIPELINE_SERIES) + 1)]
    for c, g in zip(cases, groups):
        vals = [_median(c["samples"].get(key, [])) for key, _ in PIPELINE_SERIES]
        loop, mem = vals[2], vals[1]
        ratio = f"{loop / mem:.0%}" if loop and mem else "n/a"
        lines.append(f"| {g} | " + " | ".join("n/a" if v is None else f"{v / 1e3:,.0f}K" for v in vals)
                     + f" | {ratio} |")
    return lines


def op_census(doc: dict[str, Any], plt: Any, out: Path, when: str) -> list[str]:
    ops = sorted(set(doc["before"]) | set(doc["after"]), key=lambda k: -doc["before"].get(k, {}).get("models", 0))
    before = [doc["before"].get(k, {}).get("models", 0) for k in ops]
    after = [doc["after"].get(k, {}).get("models", 0) for k in ops]
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.28 * len(ops))))
    ys = range(len(ops))
    ax.barh([y - 0.2 for y in ys], before, 0.4, label="before Trainer(portable=True)")
    ax.barh([y + 0.2 for y in ys], after, 0.4, label="after")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([k.split(":", 1)[-1] for k in ops], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("models whose step graphs hold the op")
    ax.set_title(f"bench/op_census.py: non-standard ops in {doc['graphs']} step graphs of {doc['workloads']} "
                 f"workloads, {when}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "op_census.png", dpi=90)
    plt.close(fig)
    portable = len(doc["labels"]) - sum(1 for v in doc["not_portable"].values()
                                        if any(not s.startswith("forward_backward") for ss in v.values() for s in ss))
    return [f"{portable} of {len(doc['labels'])} models' fused step graphs are portable after the rewrite."]


def river_defaults(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    results = doc["results"]
    streams = list(dict.fromkeys(r["stream"] for r in results))
    fig, axes = plt.subplots(1, len(streams), figsize=(4 * len(streams), 4))
    for ax, stream in zip(axes if len(streams) > 1 else [axes], streams):
        rows = [r for r in results if r["stream"] == stream]
        labels = ["River (its defaults)"] + [r["model"] for r in rows]
        values = [rows[0]["river"]] + [r["streamfit"] for r in rows]
        colors = ["tab:grey"] + ["tab:blue" if r["verdict"] == "met" else "tab:red" for r in rows]
        ax.bar(range(len(values)), values, color=colors)
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        worse = "lower is better" if rows[0]["metric"] == "MAE" else "higher is better"
        ax.set(title=f"{stream} ({rows[0]['rows']} rows)", ylabel=f"progressive {rows[0]['metric']} ({worse})")
        if rows[0]["metric"] == "MAE":
            ax.set_yscale("log")
    _save(fig, out / "river_defaults.png", f"bench/river_defaults.py: batch 1, predict then learn (red: missed River by > "
                 f"{doc['config']['tolerance']:.0%}); {cpu}, {when}", 10)
    lines = ["| stream | metric | model | streamfit | River | |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['stream']} | {r['metric']} | `{r['model']}` | {r['streamfit']:.4f} | {r['river']:.4f} | "
              f"{r['verdict']} |" for r in results]
    return lines

def _env_line(doc: dict[str, Any], cpu: str, when: str) -> str:
    env = doc.get("env", {})
    return (f"{cpu}, {env.get('cpu_count', '?')} cores, load {_load(env.get('loadavg_start'))} at start, "
            f"{_load(env.get('loadavg_end'))} at the end, {when}")


def _save(fig: Any, path: Path, title: str, fontsize: int = 9) -> None:
    """Title ``fig`` (the bench, its settings, the machine line), lay it out and write it as a PNG."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _short(what: str) -> str:
    """A target's text without its parenthesized explanation, for a plot's axis."""
    head = what.split(" (information")[0].replace(" (batch 1)", "").replace(" (defaults: standardize=True)", "")
    head = head.replace("(standardize=False, standardize_target=False)", "(plain)").replace("InferenceSession", "session")
    return head if len(head) <= 66 else head[:63] + "..."


def inputs(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    results, config = doc["results"], doc["config"]
    ratios = [r for r in results if not r["at_least"]]  # the accuracy difference is no ratio
    fig, ax = plt.subplots(figsize=(11, 0.38 * len(ratios) + 1.6))
    ys = range(len(ratios))
    colors = ["tab:grey" if r["target"] is None else "tab:blue" if r["met"] else "tab:red" for r in ratios]
    ax.barh(list(ys), [r["value"] for r in ratios], color=colors)
    targets = [(y, r["target"]) for y, r in zip(ys, ratios) if r["target"] is not None]
    ax.plot([t for _, t in targets], [y for y, _ in targets], "k|", markersize=14, label="target (at most)")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([_short(r["what"]) for r in ratios], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="tab:grey", linewidth=0.8)
    ax.set_xlabel("ratio (blue: target met, red: missed, grey: information)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"bench/inputs.py: batch 1, CPU time of the calling thread, {config['rounds']} rounds of "
                 f"{config['calls']} calls\n{_env_line(doc, cpu, when)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "inputs.png", dpi=90, bbox_inches="tight")  # the long labels kept whole
    plt.close(fig)
    lines = [f"{_env_line(doc, cpu, when)}; medians of {config['rounds']} rounds of {config['calls']} calls, River's "
             f"Phishing stream ({config['stream_rows']} rows) for the stream figures.", "",
             "| figure | value | target | |", "|---|---|---|---|"]
    for r in results:
        bound = "" if r["target"] is None else (">= " if r["at_least"] else "<= ") + f"{r['target']:g}"
        verdict = "information" if r["target"] is None else "met" if r["met"] else "MISSED"
        lines.append(f"| {r['what']} | {r['value']:.3f} | {bound} | {verdict} |")
    return lines


def perrow(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    rows, config = doc["streams"], doc["config"]
    streams = list(dict.fromkeys(r["stream"] for r in rows))
    configs = list(dict.fromkeys(r["configuration"] for r in rows))
    by = {(r["stream"], r["configuration"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    width = 0.8 / max(1, len(configs))
    for i, conf in enumerate(configs):
        xs = [k + (i - (len(configs) - 1) / 2) * width for k in range(len(streams))]
        axes[0].bar(xs, [by[(st, conf)]["time_ratio"] for st in streams], width, label=f"streamfit, {conf}")
        axes[1].bar(xs, [by[(st, conf)]["value"] / by[(st, conf)]["river_value"] for st in streams], width,
                    label=f"streamfit, {conf}")
    axes[0].axhline(1.0, color="tab:grey", linestyle="--", label="River's time")
    axes[0].set_title("time, predict then learn, batch_size=1", fontsize=9)
    axes[0].set_ylabel("CPU time / River's (lower is faster)")
    axes[1].axhline(1.0, color="tab:grey", linestyle="--", label="River's metric")
    axes[1].set_title("progressive accuracy / River's (TrumpApproval: MAE, lower is better)", fontsize=9)
    axes[1].set_ylabel("metric / River's")
    for ax in axes:
        ax.set_xticks(range(len(streams)))
        ax.set_xticklabels([f"{st} ({by[(st, configs[0])]['rows']} rows)" for st in streams], fontsize=8)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    _save(fig, out / "perrow.png", f"bench/perrow.py: one step per row, rows given in chunks of {config['chunk']}, beside River's "
                 f"learn_one (best of {config['rounds']} rounds)\n{_env_line(doc, cpu, when)}", 10)
    lines = [f"{_env_line(doc, cpu, when)}; sections {config['sections']}, CPU seconds (best of {config['rounds']} "
             f"interleaved rounds), rows given in chunks of {config['chunk']}.", "",
             "| stream | rows | configuration | streamfit s | River s | ratio | metric | streamfit | River |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['stream']} | {r['rows']} | {r['configuration']} | {r['streamfit_s']:.3f} | {r['river_s']:.3f} | "
              f"{r['time_ratio']:.2f} | {r['metric']} | {r['value']:.4f} | {r['river_value']:.4f} |" for r in rows]
    targets = doc["targets"]
    lines += ["", f"Targets: {sum(t['ok'] for t in targets)} of {len(targets)} met.", "",
              "| target | value | limit | |", "|---|---|---|---|"]
    lines += [f"| {t['what']} | {t['value']:.3f} | {t['limit']:g} | {'met' if t['ok'] else 'MISSED'} |"
              for t in targets]
    return lines


def bigtable(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    config, steps, rss = doc["config"], doc["steps_s"], doc["rss"]
    small, big = (str(b) for b in config["bits"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    labels, bottoms = [], []
    for opt, by_bits in steps.items():
        for bits in (small, big):
            labels.append(f"{opt}\n2^{bits} rows")
            bottoms.append(by_bits[bits])
    base = [0.0] * len(bottoms)
    for part, what in (("gather", "stage the touched rows"), ("rest", "fused graph run"),
                       ("update", "rows update and write-back")):
        values = [t[part] * 1e3 for t in bottoms]
        axes[0].bar(range(len(values)), values, bottom=base, label=what)
        base = [a + b for a, b in zip(base, values)]
    axes[0].set_xticks(range(len(labels)))
    axes[0].set_xticklabels(labels, fontsize=8)
    axes[0].set_ylabel("ms per step (the median of each part)")
    axes[0].set_title(f"step time: batch {config['batch']} x {config['fields']} ids, dim {config['dim']}", fontsize=9)
    axes[0].legend(fontsize=7)
    kinds = ("built", "trained", "peak", "state_dict_peak")
    width = 0.8 / max(1, len(rss))
    for i, (opt, r) in enumerate(rss.items()):
        axes[1].bar([k + (i - (len(rss) - 1) / 2) * width for k in range(len(kinds))], [r[k] for k in kinds], width,
                    label=opt)
    axes[1].set_xticks(range(len(kinds)))
    axes[1].set_xticklabels(["built", "after 10 steps", "peak", "+ state_dict()"], fontsize=8)
    axes[1].set_ylabel("RSS growth / table bytes")
    axes[1].set_title(f"memory of a fresh process, 2^{big}-row table", fontsize=9)
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"bench/bigtable.py: a 2^{big}-row table against a 2^{small}-row one, row-sparse steps "
                 f"({config['rounds']} interleaved rounds of {config['steps']} steps)\n{_env_line(doc, cpu, when)}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "bigtable.png", dpi=90)
    plt.close(fig)
    lines = [f"{_env_line(doc, cpu, when)}; medians of {config['rounds']} interleaved rounds of {config['steps']} "
             "steps.", "", f"| optimizer | step, 2^{small} rows | step, 2^{big} rows | ratio (target <= 1.2) |",
             "|---|---|---|---|"]
    lines += [f"| {opt} | {t[small]['step'] * 1e3:.2f} ms | {t[big]['step'] * 1e3:.2f} ms | "
              f"{t[big]['step'] / t[small]['step']:.2f} |" for opt, t in steps.items()]
    lines += ["", "Floor (bare numpy gather + add + scatter of one batch's distinct rows, sorted ids): " + "; ".join(
        f"{what} {f[small]['sorted'] * 1e3:.2f} ms (2^{small}) vs {f[big]['sorted'] * 1e3:.2f} ms (2^{big})"
        for what, f in doc["floor_s"].items()) + "."]
    return lines


def columns(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    config, cases = doc["config"], doc["cases"]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(cases) + 1.6))
    ys = list(range(len(cases)))
    ax.barh(ys, [c["ns_per_row"] for c in cases])
    for y, c in zip(ys, cases):
        ax.text(c["ns_per_row"], y, f"  x{c['vs_features']:.2f}", va="center", fontsize=8)
    ax.set_yticks(ys)
    ax.set_yticklabels([c["case"] for c in cases], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ns per row (best of the rounds); x: against features=")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"bench/columns.py: record batches of {config['rows']:,} rows x {config['columns']} float32 columns "
                 f"(+ a categorical) into {config['batch']}-row training batches\n{_env_line(doc, cpu, when)}",
                 fontsize=9)
    fig.savefig(out / "columns.png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    lines = [f"{_env_line(doc, cpu, when)}; best of {config['rounds']} interleaved rounds.", "",
             "| column plan | ns per row | against `features=` |", "|---|---|---|"]
    lines += [f"| `{c['case']}` | {c['ns_per_row']:.1f} | {c['vs_features']:.2f} |" for c in cases]
    return lines


def primitives(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    layers = doc["ops_us"]
    ops = list(next(iter(layers.values())))
    fig, ax = plt.subplots(figsize=(10, 4.2))
    _bars(ax, ops, {f"layer {layer}": [layers[layer][op] for op in ops] for layer in layers}, "us per run", log=False)
    ax.set_xticklabels(ops, rotation=20, ha="right", fontsize=7)
    ax.set_title(f"bench/primitives.py: single ops of an MLP 100-256-256-1 step at batch 1, one thread (a session run "
                 f"costs {doc['run_us']:.2f} us, each further node {doc['node_us']:.2f} us)\n{_env_line(doc, cpu, when)}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "primitives.png", dpi=90)
    plt.close(fig)
    lines = [f"{_env_line(doc, cpu, when)}; thread CPU time, best of 7 repeats of {doc['config']['runs']} runs. A session "
             f"run of one node: {doc['run_us']:.2f} us; each further node: {doc['node_us']:.2f} us.", "",
             "| op | " + " | ".join(f"layer {layer} (us)" for layer in layers) + " |", "|---|" + "---|" * len(layers)]
    lines += [f"| {op} | " + " | ".join(f"{layers[layer][op]:.2f}" for layer in layers) + " |" for op in ops]
    return lines


def ort_versions(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    results, versions = doc["results"], doc["versions"]
    keys = [f"{w}/{v}" for w in versions for v in ("original", "portable")]
    label = {k: f"onnxruntime {versions[k.split('/')[0]]}, {k.split('/')[1]} graph" for k in keys}
    groups = [f"{r['model']} batch {r['rows']}" for r in results]
    fig, ax = plt.subplots(figsize=(10, 4.6))
    _bars(ax, groups, {label[k]: [r["us_per_step"].get(k) for r in results] for k in keys}, "us per step (log)")
    ax.set_title(f"bench/ort_versions.py: the fused step graphs on each onnxruntime (a missing bar: the graph does not "
                 f"load there), {doc['config']['rounds']} interleaved rounds\n{_env_line(doc, cpu, when)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "ort_versions.png", dpi=90)
    plt.close(fig)
    lines = [f"{_env_line(doc, cpu, when)}; us per fused step, medians of {doc['config']['rounds']} interleaved rounds "
             "(ratios: medians of per-round ratios, < 1 is faster).", "",
             "| case | " + " | ".join(label[k] for k in keys) + " | newest portable / 1.19.2 original |", "|---|"
             + "---|" * (len(keys) + 1)]
    for r, g in zip(results, groups):
        cells = [f"{r['us_per_step'][k]:.1f}" if k in r["us_per_step"] else ("does not load" if k in r["errors"] else
                                                                             "-") for k in keys]
        ratio = r.get("new_portable_vs_1192_original")
        lines.append(f"| {g} | " + " | ".join(cells) + f" | {'-' if ratio is None else f'{ratio:.2f}'} |")
    return lines


def _by_op(case: dict[str, Any]) -> dict[str, float]:
    """A profiled step's kernel time summed per op type (us), slowest first."""
    ops: dict[str, float] = {}
    for n in case["nodes"]:
        ops[n["op"]] = ops.get(n["op"], 0.0) + n["us"]
    return dict(sorted(ops.items(), key=lambda kv: -kv[1]))


def profile_step(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    cases, config = doc["cases"], doc["config"]
    per_op = [_by_op(c) for c in cases]
    ops = list(dict.fromkeys(op for o in per_op for op in o))
    shown = ops[:8] + (["other ops"] if len(ops) > 8 else [])
    shares = [{**{op: o.get(op, 0.0) for op in ops[:8]}, "other ops": sum(o.get(op, 0.0) for op in ops[8:]),
               "executor overhead": c["overhead_us"]} for c, o in zip(cases, per_op)]
    groups = [*shown, "executor overhead"]
    series = {f"batch {c['batch']} ({c['model_run_us']:,.0f} us a run)":
              [100 * sh[g] / c["model_run_us"] for g in groups] for c, sh in zip(cases, shares)}
    fig, ax = plt.subplots(figsize=(10, 4.4))
    _bars(ax, groups, series, "% of the session run (model_run)", log=False)
    sizes = "-".join(map(str, config["sizes"]))
    ax.set_title(f"bench/profile_step.py: where a fused step's time goes (MLP {sizes}, SGD, {config['threads']} "
                 f"threads, ORT's profiler, mean of {config['steps']} steps)\n{_env_line(doc, cpu, when)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "profile_step.png", dpi=90)
    plt.close(fig)
    lines = [f"{_env_line(doc, cpu, when)}; MLP {sizes}, squared error, SGD, {config['threads']} threads, "
             f"{config['steps']} profiled steps per batch size (profiling adds a few us per node: the shares are "
             "the point, `bench/engine.py` the speed).", "",
             "| batch | graph | nodes | step (wall) | rows/s | model_run | kernels | executor overhead | GEMM-like share |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        gemm = sum(n["us"] for n in c["nodes"] if n["gflops"])
        lines.append(f"| {c['batch']} | {c['graph']} | {len(c['nodes'])} | {c['wall_us']:,.0f} us | "
                     f"{c['rows_per_s'] / 1e3:,.0f}K | {c['model_run_us']:,.0f} us | {c['kernels_us']:,.0f} us | "
                     f"{c['overhead_us']:,.0f} us | {100 * gemm / max(c['kernels_us'], 1e-9):.0f} % |")
    lines += ["", "| op type | " + " | ".join(f"batch {c['batch']} (us, % of kernels)" for c in cases) + " |",
              "|---|" + "---|" * len(cases)]
    for op in ops[:8]:
        lines.append(f"| {op} | " + " | ".join(f"{o.get(op, 0.0):,.1f} ({100 * o.get(op, 0.0) / c['kernels_us']:.0f} %)"
                                             for c, o in zip(cases, per_op)) + " |")
    return lines


def _package(file: str) -> str:
    return file.split("/")[0] if "/" in file else "(root)"


def message_path(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    config, files = doc["config"], doc["per_file"]
    pkgs = list(dict.fromkeys(_package(f["file"]) for f in files))
    colors = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(pkgs)}
    fig, ax = plt.subplots(figsize=(9, 0.22 * len(files) + 1.8))
    ys = list(range(len(files)))
    ax.barh(ys, [f["calls_per_batch"] for f in files], color=[colors[_package(f["file"])] for f in files])
    for y, f in zip(ys, files):
        ax.text(f["calls_per_batch"], y, f"  {len(f['functions'])} fn", va="center", fontsize=6)
    ax.set_yticks(ys)
    ax.set_yticklabels([f["file"] for f in files], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("calls per batch into the file (fn: its functions entered on every batch)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"bench/message_path.py: {doc['functions']} streamfit functions, {doc['calls_per_batch']:.0f} calls, "
                 f"{doc['files']} files, {doc['packages']} packages per {config['batch']}-row Parquet batch "
                 f"(steady state of {config['batches']})\n{_env_line(doc, cpu, when)}", fontsize=8)
    fig.savefig(out / "message_path.png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    lines = [f"{_env_line(doc, cpu, when)} (counts, not times: they do not depend on the machine). A "
             f"`LinearRegressor(batch_size={config['batch']})` trained by `train_stream_sync` on {config['batches']} "
             f"Parquet row groups of {config['features']} float32 features; a function counts when it is entered at "
             "least once per batch.", "",
             "| package | files | functions entered every batch | calls per batch |", "|---|---|---|---|"]
    for p in pkgs:
        mine = [f for f in files if _package(f["file"]) == p]
        lines.append(f"| `{p}` | {len(mine)} | {sum(len(f['functions']) for f in mine)} | "
                     f"{sum(f['calls_per_batch'] for f in mine):.0f} |")
    lines.append(f"| all | {doc['files']} | {doc['functions']} | {doc['calls_per_batch']:.0f} |")
    return lines


def checkpoint(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    config, arms = doc["config"], [a for a in doc["arms"] if "error" not in a]
    names = [a["arm"] for a in arms]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    rates = [a["rows_per_s"] or 0 for a in arms]
    axes[0].bar(names, rates, yerr=[r * (a["spread"] or 0) for r, a in zip(rates, arms)], capsize=4)
    axes[0].set(ylabel="rows/s (median; bar: +-half the IQR)", title="training rows/s per checkpoint interval")
    changed = [a for a in arms if a["vs_none"]]
    xs = list(range(len(changed)))
    med = [100 * a["vs_none"][0] for a in changed]
    axes[1].errorbar(xs, med, yerr=[[m - 100 * a["vs_none"][1] for m, a in zip(med, changed)],
                                    [100 * a["vs_none"][2] - m for m, a in zip(med, changed)]],
                     fmt="o", capsize=4, label="rows/s against none [quartiles of same-round pairs]")
    axes[1].plot(xs, [-100 * (a["model_cost"] or 0) for a in changed], "x", color="tab:red",
                 label="cost model: -(pauses + writer CPU / cores)")
    axes[1].axhline(-100 * config["target_slowdown"], color="grey", ls="--", lw=1, label="target (5 s): -2 %")
    axes[1].axhline(0, color="black", lw=0.5)
    axes[1].set_xticks(xs)
    axes[1].set_xticklabels([a["arm"] for a in changed])
    axes[1].set(ylabel="% change against no checkpoints", title="what the checkpoints cost")
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    _save(fig, out / "checkpoint.png", f"bench/checkpoint.py: MLP {'-'.join(map(str, config['sizes']))} ({config['optimizer']}), batch "
                 f"{config['batch']}, daemon Runner from {config['source']}, {config['rounds']} interleaved rounds of "
                 f"{config['seconds']:.0f} s per arm\n{_env_line(doc, cpu, when)}", 9)
    lines = [f"{_env_line(doc, cpu, when)}; medians of {config['rounds']} interleaved rounds of "
             f"{config['warmup']:.0f} s warm-up + {config['seconds']:.0f} s per arm. Change: median of same-round "
             "pairs against `none` [quartiles]; pause: the loop stopped while a checkpoint's snapshot is taken; "
             "write: the background save; cost model: pauses + writer CPU / cores, a share of the window.", "",
             "| every | rows/s | +- half IQR | change vs none | checkpoints a run | pause ms | write ms | cost model |",
             "|---|---|---|---|---|---|---|---|"]
    for a in arms:
        v = a["vs_none"]
        lines.append(f"| {a['arm']} | {a['rows_per_s'] / 1e3:,.0f}K | {100 * (a['spread'] or 0):.1f} % | "
                     + ("-" if v is None else f"{100 * v[0]:+.1f} % [{100 * v[1]:+.1f}, {100 * v[2]:+.1f}]")
                     + f" | {a['checkpoints'] or 0:.0f} | {_opt(a['pause_ms'], '.2f')} | {_opt(a['write_ms'], '.1f')} | "
                     + ("-" if a["model_cost"] is None else f"{100 * a['model_cost']:.2f} %") + " |")
    lines += [f"| {a['arm']} | error: {a['error']} | | | | | | |" for a in doc["arms"] if "error" in a]
    spread = max((a["spread"] or 0 for a in arms), default=0)
    if spread > config["target_slowdown"]:
        lines += ["", f"Rows/s move by up to +-{100 * spread:.1f} % between samples of one arm here, more than the "
                  f"{100 * config['target_slowdown']:.0f} % target: the change against `none` cannot resolve it, the "
                  "cost model is the sharper estimate."]
    return lines


def _opt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def hashing(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    config, column, encode, fit = doc["config"], doc["hash_column"], doc["encode"], doc["fit"]
    base = config["baseline"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4))
    ns = [r["n"] for r in column]
    axes[0].plot(ns, [r["session_us"] for r in column], "o-", label="MurmurHash3 session (old)")
    axes[0].plot(ns, [r["numpy_us"] for r in column], "s-", label="murmur3_arrow, numpy (new)")
    axes[0].set(xscale="log", yscale="log", xlabel="strings in the column", ylabel="us per call (CPU, log)",
                title="hash one string column")
    for columns, marker in ((1, "o"), (20, "s")):
        rows = [r for r in encode if r["columns"] == columns]
        xs = [r["n"] for r in rows]
        axes[1].plot(xs, [r["old_us"] for r in rows], marker + "--", label=f"{columns} col, old tree")
        axes[1].plot(xs, [r["new_us"] for r in rows], marker + "-", label=f"{columns} col, new")
    axes[1].set(xscale="log", yscale="log", xlabel="rows", ylabel="us per call (CPU, log)",
                title="Hashed.encode")
    _bars(axes[2], [f"batch {r['batch']}" for r in fit], {f"old tree ({base})": [r["old_rows_per_s"] for r in fit],
                                                         "new": [r["new_rows_per_s"] for r in fit]}, "rows/s (CPU, log)")
    axes[2].set_title("LogisticRegression, 20 string columns, partial_fit", fontsize=10)
    for ax in axes[:2]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, out / "hashing.png", f"bench/hashing.py: string hashing in onnxruntime (the old path, tree {base}) against numpy (the new), "
                 f"CPU time, best of {config['rounds']} rounds\n{_env_line(doc, cpu, when)}", 9)
    lines = [f"{_env_line(doc, cpu, when)}; this thread's or process's CPU time, best of {config['rounds']} rounds; "
             f"old tree: `{base}` checked out as a git worktree; distinct strings of 8-24 letters.", "",
             "| strings | session (old) us | numpy (new) us | speed-up |", "|---|---|---|---|"]
    lines += [f"| {r['n']:,} | {r['session_us']:,.1f} | {r['numpy_us']:,.1f} | {r['session_us'] / r['numpy_us']:.2f}x |"
              for r in column]
    lines += ["", "| `Hashed.encode` rows | columns | old tree us | new us | speed-up |", "|---|---|---|---|---|"]
    lines += [f"| {r['n']:,} | {r['columns']} | {r['old_us']:,.1f} | {r['new_us']:,.1f} | {r['old_us'] / r['new_us']:.2f}x |"
              for r in encode]
    lines += ["", "| `partial_fit` batch | old rows/s | new rows/s | speed-up | old RSS growth MB | new RSS growth MB |"
              " batches |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['old_rows_per_s']:,.0f} | {r['new_rows_per_s']:,.0f} | "
              f"{r['new_rows_per_s'] / r['old_rows_per_s']:.2f}x | {r['old_rss_growth_mb']:.1f} | "
              f"{r['new_rss_growth_mb']:.1f} | {r['batches']:,} |" for r in fit]
    return lines


def soak(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    config, samples, produced = doc["config"], doc["samples"], doc["produced"]
    model = (f"hashed LogisticRegression (FTRL, {config['buckets']:,} buckets)" if config["hashed"]
             else "LinearRegressor (20 float32 features)")
    ts = [x["t"] for x in samples]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.0))
    rss = [x["rss_mb"] for x in samples]
    axes[0].plot(ts, rss)
    axes[0].set_ylim(0.95 * min(rss, default=0), 1.05 * max(rss, default=1))  # a few MB look as small as they are
    axes[0].set(ylabel="MB", title=f"daemon RSS (slope, second half: {_opt(doc['rss_slope_mb_per_h'], '+.1f')} MB/h)")
    lagged = [x for x in samples if x["lag_s"] is not None]
    axes[1].plot([x["t"] for x in lagged], [x["lag_s"] for x in lagged])
    axes[1].set(ylabel="s", title=f"lag: age of the oldest untrained row (p95 {_opt(doc['lag_p95_s'], '.2f')} s)")
    trained = [x for x in samples if x["metric_rows"] is not None]
    axes[2].plot([x["t"] for x in trained], [x["metric_rows"] for x in trained], label="rows trained")
    axes[2].set(ylabel="rows", title=f"rows trained ({_opt(doc['rows_per_s'], ',.0f')}/s)")
    for ax in axes:
        ax.set_xlabel("seconds since the daemon started")
        ax.grid(alpha=0.3)
    _save(fig, out / "soak.png", f"bench/soak.py: `streamfit serve` on a live Kafka topic, {model}, {config['rate']:,.0f} rows/s for "
                 f"{config['duration']:.0f} s, {config['bad_fraction']:.0%} of messages bad; exactly once: "
                 f"{'OK' if doc['exactly_once'] else 'FAILED'}\n{_env_line(doc, cpu, when)}", 9)
    bad = sum(v for k, v in produced["kinds"].items() if k != "good")
    lines = [f"{_env_line(doc, cpu, when)}; {model}, batch {config['batch_size']}, {config['rate']:,.0f} rows/s for "
             f"{config['duration']:.0f} s ({config['rows_per_message']} rows per message, {bad} of "
             f"{produced['messages']:,} messages bad), a checkpoint every {config['checkpoint_every']:g} s, "
             f"a publication every {config['publish_every']:g} s. A {config['duration']:.0f}-s run: the RSS slope "
             "over its second half is a short fit, not an hour's.", "", "| figure | value |", "|---|---|",
             f"| RSS first / last / max | {_opt(doc['rss_first_mb'], '.0f')} / {_opt(doc['rss_last_mb'], '.0f')} / "
             f"{_opt(doc['rss_max_mb'], '.0f')} MB |",
             "| fds first / last / max | " + " / ".join(map(str, doc["fds"] or [])) + " |",
             "| threads first / last / max | " + " / ".join(map(str, doc["threads"] or [])) + " |",
             f"| lag p50 / p95 (second half) | {_opt(doc['lag_p50_s'], '.2f')} s / {_opt(doc['lag_p95_s'], '.2f')} s |",
             f"| checkpoint writes p50 / p95 / max | {_opt(doc['checkpoint_write_p50_ms'], '.1f')} / "
             f"{_opt(doc['checkpoint_write_p95_ms'], '.1f')} / {_opt(doc['checkpoint_write_max_ms'], '.1f')} ms "
             f"({doc['checkpoints']} written) |",
             f"| SIGTERM | exit {doc['sigterm_exit_code']} in {_opt(doc['sigterm_exit_s'], '.2f')} s |",
             f"| rows trained | {doc['rows_trained'] or 0:,} of {produced['good_rows']:,} good rows |"]
    lines += [f"| {name} | {'ok' if ok else 'FAILED'} |" for name, ok in doc["checks"].items()]
    return lines


def scaleout(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    config, results = doc["config"], doc["results"]
    arms = (("one_process", "one process, no Ray"), ("one_learner", "1 learner actor"),
            ("two_learners", "2 learner actors"), ("two_learners_adam", "2 learners, Adam"))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))

    def rate(r: dict[str, Any], key: str) -> float:
        return r[key] if key == "one_process" else r[key]["rate"]

    _bars(axes[0], [r["title"] for r in results], {label: [rate(r, key) for r in results] for key, label in arms},
          "rows/s", log=False)
    axes[0].set_ylim(0, 1.3 * max(rate(r, key) for r in results for key, _ in arms))  # room for the legend
    axes[0].set_title("measured: a local 2-node Ray cluster on this machine", fontsize=9)
    for r, marker, color in zip(results, "os^", ("tab:blue", "tab:orange", "tab:green")):
        ms = [x["machines"] for x in r["projection"]["machines"]]
        axes[1].plot(ms, [x["star_rows_per_s"] for x in r["projection"]["machines"]], marker + "-", color=color,
                     label=f"{r['title']}: star")
        axes[1].plot(ms, [x["ideal_rows_per_s"] for x in r["projection"]["machines"]], marker + ":", color=color,
                     label=f"{r['title']}: no sync cost")
    axes[1].set(xscale="log", yscale="log", xlabel="machines M (one learner each)", ylabel="rows/s (log)")
    axes[1].set_xticks(ms)
    axes[1].set_xticklabels([str(m) for m in ms])
    axes[1].minorticks_off()
    axes[1].set_title("projected on paper from the measured compute and sync costs (NOT measured)", fontsize=9)
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    _save(fig, out / "scaleout.png", f"bench/scaleout.py: streamfit.distributed, batch {config['batch']}, a sync every "
                 f"{config['sync_every']} batches, {config['nodes']} Ray nodes of {config['cpus_per_node']} CPU on "
                 f"127.0.0.1\n{_env_line(doc, cpu, when)}", 9)
    lines = [f"{_env_line(doc, cpu, when)}; Parquet, {config['files']} files dealt to the learners; learner rates "
             "from the end of the first round to the end of the run. Both nodes share the machine's 2 cores with "
             "the coordinator and the reads: 2 learners are not expected to reach 2x here. One run per arm, not "
             "interleaved rounds: with other jobs on the cores, one arm can be off by tens of percent.", "",
             "| model | " + " | ".join(label for _, label in arms) + " | sync ms a round (1 / 2 learners) | "
             "kB a round (2 learners, SGD / Adam) |", "|---|" + "---|" * (len(arms) + 2)]
    for r in results:
        lines.append(f"| {r['title']} | " + " | ".join(f"{rate(r, key) / 1e3:,.0f}K" for key, _ in arms)
                     + f" | {r['one_learner']['sync_ms']:.1f} / {r['two_learners']['sync_ms']:.1f} | "
                     f"{r['two_learners']['bytes'] / 1e3:,.1f} / {r['two_learners_adam']['bytes'] / 1e3:,.1f} |")
    lines += ["", "Projection (star: every state through the coordinator's link; assumptions in the bench's output):",
              "", "| model | c us/row | a0 ms | a1 ms/learner | " + " | ".join(
                  f"M={x['machines']}" for x in results[0]["projection"]["machines"]) + " |",
              "|---|---|---|---|" + "---|" * len(results[0]["projection"]["machines"])]
    for r in results:
        pr = r["projection"]
        lines.append(f"| {r['title']} | {pr['c_us_per_row']:.2f} | {pr['a0_ms']:.2f} | {pr['a1_ms']:.2f} | "
                     + " | ".join(f"{x['star_rows_per_s'] / 1e3:,.0f}K ({x['star_sync_share']:.0%} sync)"
                                  for x in pr["machines"]) + " |")
    return lines


def chunk_steps(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    steps, ests = doc["steps"], doc["estimators"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [max(1, len(steps)),
                                                                                   max(1, len(ests))]})
    _bars(axes[0], [f"{c['model']} B={c['batch']} C={c['chunk']}" for c in steps],
          {"chunk (one session run)": [c["chunk_us_per_row"] for c in steps],
           "one session run per step": [c["step_us_per_row"] for c in steps]}, "us per row (log)")
    axes[0].set_title("Trainer: train_chunk against Trainer.step", fontsize=9)
    _bars(axes[1], [f"{c['estimator']} C={c['chunk']}" for c in ests],
          {"partial_fit_predict of C rows": [c["chunk_us_per_row"] for c in ests],
           "one call per row": [c["per_call_us_per_row"] for c in ests]}, "us per row (log)")
    axes[1].set_title("estimators at batch_size=1", fontsize=9)
    _save(fig, out / "chunk_steps.png", f"bench/chunk_steps.py: many steps per session run (B rows per step, chunks of C rows), "
                 f"{doc['config']['rounds']} interleaved rounds\n{_env_line(doc, cpu, when)}", 10)
    lines = [f"{_env_line(doc, cpu, when)}; microseconds per row, medians of {doc['config']['rounds']} interleaved "
             "rounds; ratio: chunk / one run per step (median of the rounds' ratios).", "",
             "| model | B | C | chunk us/row | per-step us/row | ratio |", "|---|---|---|---|---|---|"]
    lines += [f"| {c['model']} | {c['batch']} | {c['chunk']} | {c['chunk_us_per_row']:.2f} | {c['step_us_per_row']:.2f} "
              f"| {c['ratio']:.2f} |" for c in steps]
    lines += ["", "| estimator (batch_size=1) | C | chunk us/row | per-call us/row | ratio |", "|---|---|---|---|---|"]
    lines += [f"| `{c['estimator']}` | {c['chunk']} | {c['chunk_us_per_row']:.2f} | {c['per_call_us_per_row']:.2f} | "
              f"{c['ratio']:.2f} |" for c in ests]
    return lines


def sparse(doc: dict[str, Any], plt: Any, out: Path, cpu: str, when: str) -> list[str]:
    results, config = doc["results"], doc["config"]
    keys = list(results)
    colors = ["tab:grey" if k.startswith(("vw", "river")) else "tab:blue" for k in keys]
    names = [results[k]["name"].replace("streamfit ", "").replace("LogisticRegression", "LR") for k in keys]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    axes[0].bar(range(len(keys)), [results[k]["rows_per_s"] for k in keys], color=colors)
    axes[0].set_yscale("log")
    axes[0].set(ylabel="rows/s (log)", title="speed (grey: Vowpal Wabbit, River)")
    axes[1].bar(range(len(keys)), [results[k]["log_loss"] for k in keys], color=colors)
    lows = [results[k]["log_loss"] for k in keys]
    axes[1].set_ylim(min(lows) * 0.95, max(lows) * 1.02)
    axes[1].set(ylabel="progressive log loss (lower is better)", title="progressive log loss over each run's rows")
    for ax in axes:
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    _save(fig, out / "sparse.png", f"bench/sparse.py: the click stream ({config['rows']:,} rows at batch 1024 and for VW, "
                 f"{config['rows_1']:,} at batch 1, {config['rows_river']:,} for River; 2^{config['bits']} buckets)"
                 f"\n{_env_line(doc, cpu, when)}", 10)
    lines = [f"{_env_line(doc, cpu, when)}; each learner predicts each batch before training on it. Rows differ "
             f"by learner (their column): compare log losses on the same rows in the last column (the first "
             f"{config['rows_1']:,}).", "",
             f"| learner | rows | rows/s | log loss | AUC | log loss, first {config['rows_1']:,} rows |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['rows']:,} | {r['rows_per_s']:,.0f} | {r['log_loss']:.4f} | {r['auc']:.4f} | "
              f"{r['log_loss_first_rows_1']:.4f} |" for r in results.values()]
    if doc.get("table_step_ms"):
        lines += ["", "Step time against table size: " + ", ".join(
            f"2^{b} rows {ms:.2f} ms" for b, ms in doc["table_step_ms"].items()) + "."]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DATA, help="directory of the benches' JSON (default: %(default)s)")
    p.add_argument("--out", type=Path, default=OUT, help="where the PNGs and _figures.md go (default: %(default)s)")
    p.add_argument("--record", nargs="+", metavar="NAME", help="note the date and CPU of these benches' JSON "
                                                              "(run on the machine that ran them), then plot")
    args = p.parse_args(argv)
    if args.record:
        record(args.data, args.record)
    runs = _runs(args.data)
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    md = ["<!-- generated by bench/plots.py from docs/benchmarks/data/*.json: do not edit -->", ""]
    made = []
    for name in BENCHES:
        path = args.data / f"{name}.json"
        md.append(f"### `bench/{name}.py`")
        md.append("")
        if not path.exists():
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            md += [f"No JSON yet: run `python bench/{name}.py --json {shown}`.", ""]
            continue
        doc = json.loads(path.read_text())
        run = runs.get(name, {})
        when = run.get("date", "date not recorded")
        cpu = run.get("cpu") or doc.get("env", {}).get("cpu_model") or "CPU not recorded"
        if name == "engine":
            env = doc["env"]
            md.append(f"{cpu}, {env.get('cpu_count')} cores, onnxruntime {env.get('onnxruntime')}, load average "
                      f"{_load(env.get('loadavg_start'))} at the start, {_load(env.get('loadavg_end'))} at the end, "
                      f"{when}; rows/s from interleaved rounds (medians). Batch 1 in us per step.")
            md += ["", *engine(doc, plt, args.out, cpu, when)]
        elif name == "pipeline":
            md.append(f"{cpu}, {when}; rows/s (medians of {doc['args'].get('rounds') or 3} interleaved rounds), batch "
                      f"{doc['args'].get('batch')}.")
            md += ["", *pipeline(doc, plt, args.out, cpu, when)]
        elif name == "river_defaults":
            md.append(f"{cpu}, {when}: the ready-made models with their defaults against River's "
                      f"`StandardScaler | LinearRegression`/`LogisticRegression` on River's bundled streams.")
            md += ["", *river_defaults(doc, plt, args.out, cpu, when)]
        elif name == "op_census":
            md += op_census(doc, plt, args.out, when)
        else:
            md += globals()[name](doc, plt, args.out, cpu, when)
        md += ["", f"![{name}]({name}.png)", ""]
        made.append(name)
    (args.out / "_figures.md").write_text("\n".join(md))
    print(f"plots: {', '.join(f'{n}.png' for n in made) or 'none'} and _figures.md in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
