"""The Grafana dashboard in deploy/grafana queries only metrics streamfit exports, and shows every one of them.

The names come from the exporters themselves: a real :class:`~streamfit.daemon.health.Metrics` on 127.0.0.1,
scraped over HTTP (its ``# TYPE`` lines), and the gauges the Ray coordinator adds to that registry (per learner,
created once learners report: read from the code of :mod:`streamfit.distributed`), not from a list kept beside
the test.
"""

from __future__ import annotations

import ast
import json
import re
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from streamfit.daemon.health import Metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "streamfit.json"
#: PromQL functions, aggregations and keywords the dashboard may use (anything else is a metric name)
PROMQL = {"rate", "irate", "increase", "delta", "deriv", "time", "sum", "max", "min", "avg", "count", "by",
          "without", "clamp_min", "clamp_max", "max_over_time", "min_over_time", "avg_over_time", "topk",
          "label_values", "abs", "offset", "bool", "on", "ignoring", "group_left", "group_right", "and", "or",
          "unless", "histogram_quantile", "changes", "resets", "timestamp"}


def _exported() -> dict[str, set[str]]:
    """Metric name -> its label names, as a live exporter serves them."""
    metrics = Metrics(0)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics", timeout=30).read().decode()
        labels = {m.name: set() for m in metrics.registry.collect()}
        for family in metrics.registry.collect():
            labels[family.name] = set(getattr(metrics, _attr(metrics, family.name))._labelnames)
    finally:
        metrics.close()
    served = set(re.findall(r"^# TYPE (\w+) ", text, re.M))
    assert served == set(labels), (served, set(labels))
    return labels


def _coordinator_gauges() -> dict[str, set[str]]:
    """Metric name -> its label names, of every ``prom.Gauge(NAME, HELP, [LABELS])`` in streamfit/distributed."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "streamfit" / "distributed").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in \
                    ("Gauge", "Counter") and node.args and isinstance(node.args[0], ast.Constant):
                labels = node.args[2] if len(node.args) > 2 else next(
                    (k.value for k in node.keywords if k.arg == "labelnames"), None)
                names = {e.value for e in labels.elts} if isinstance(labels, (ast.List, ast.Tuple)) else set()
                out[node.args[0].value] = names
    return out


def _attr(metrics: Metrics, name: str) -> str:
    for attr, value in vars(metrics).items():
        if getattr(value, "_name", None) == name:
            return attr
    raise AssertionError(f"no attribute of Metrics exports {name}")


def _queries(dashboard: dict) -> list[str]:
    out = []
    for panel in dashboard["panels"]:
        out += [t["expr"] for t in panel.get("targets", [])]
    for var in dashboard.get("templating", {}).get("list", []):
        q = var.get("query")
        out.append(q["query"] if isinstance(q, dict) else q)
    return out


def _metric_names(expr: str) -> set[str]:
    """The metric names of a PromQL expression: identifiers outside label matchers, ranges and strings that
    are not functions or keywords."""
    bare = re.sub(r'"[^"]*"', "", expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(by|without)\s*\([^)]*\)", "", bare)  # grouping labels
    bare = re.sub(r"label_values\(\s*(\w+)\s*,\s*\w+\s*\)", r"\1", bare)
    return {t for t in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare) if t not in PROMQL}


def test_every_metric_the_dashboard_queries_is_exported_and_every_exported_one_is_shown():
    exported = {**_exported(), **_coordinator_gauges()}
    dashboard = json.loads(DASHBOARD.read_text())
    queried: set[str] = set()
    for expr in _queries(dashboard):
        names = _metric_names(expr)
        assert names, f"no metric in {expr!r}"
        unknown = names - set(exported)
        assert not unknown, f"{expr!r} queries {sorted(unknown)}, not exported by streamfit (exported: {sorted(exported)})"
        queried |= names
        for metric, label_set in re.findall(r"(\w+)\{([^}]*)\}", expr):
            used = set(re.findall(r"(\w+)\s*[=!]~?", label_set)) - {"instance", "job"}  # added by Prometheus
            assert used <= exported[metric], f"{expr!r}: {metric} has labels {sorted(exported[metric])}"
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            for label in (g.strip() for g in group.split(",")):
                assert any(label in exported[n] for n in names), f"{expr!r}: no metric of it has label {label!r}"
    assert queried == set(exported), f"not on the dashboard: {sorted(set(exported) - queried)}"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_the_coordinator_gauges_are_found():
    # the per-learner rows the Ray coordinator exports: on the dashboard (a panel of its own)
    assert _coordinator_gauges()["streamfit_learner_rows_trained"] == {"learner"}


def test_the_parser_sees_a_wrong_name():
    assert _metric_names('sum by (reason) (rate(streamfit_rows_skiped{instance=~"$instance"}[5m]))') == \
        {"streamfit_rows_skiped"}
    assert _metric_names("time() - streamfit_last_batch_timestamp") == {"streamfit_last_batch_timestamp"}
