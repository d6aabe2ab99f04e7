"""How learners' states become one: parameter mixing of weights (and optimizer state), exact scaler merges.

Pure numpy on the named arrays of an estimator's state (``trainer/weights/W``, ``trainer/optimizer/...``,
running statistics ``<name>/count|mean|m2`` such as ``scaler/`` and ``target_scaler/``), so it is testable
without Ray or onnxruntime.

* Weights (and, with ``sync_optimizer``, optimizer state such as Adam's moments) are averaged over the
  learners that trained in the round, each weighted by the rows it trained in it: iterative parameter
  mixing (McDonald et al. 2010; Vowpal Wabbit's AllReduce averages the same way), i.e. local SGD.  A
  learner whose share has ended contributes nothing, instead of pulling the others back.
* Running statistics (count, mean, sum of squared deviations: feature and target scalers) are merged exactly: each learner's
  rows since the last synchronization are taken out of its statistics (Welford's formulas backwards) and
  all of them are added to the previous global statistics (Chan et al.'s parallel formula), so the result
  equals the statistics of every row seen by any learner.  A scaler that keeps its statistics as sums of
  deviations from a shift (``shift``, ``s1``, ``s2``: :class:`~streamfit.models.scaler.RunningScaler`) gets the
  merged statistics in that form too (shift = the merged mean, s1 = 0, s2 = the merged m2), so the state a
  learner loads is one scaler, not merged counts beside its own sums.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["synced_names", "mix"]

_WEIGHTS = "trainer/weights/"
_OPTIMIZER = "trainer/optimizer/"
_STATS = ("count", "mean", "m2")
_SUMS = ("shift", "s1", "s2")  # the same statistics as sums of deviations from a shift, when a scaler keeps them


def _stat_groups(names: "Mapping[str, object] | list[str]") -> list[str]:
    """Prefixes ``p`` with ``p/count``, ``p/mean`` and ``p/m2`` all present: running statistics (Welford)."""
    keys = set(names)
    return sorted({n.rsplit("/", 1)[0] for n in keys if "/" in n and n.rsplit("/", 1)[1] == "count"
                   and all(f"{n.rsplit('/', 1)[0]}/{k}" in names for k in _STATS)})


def synced_names(arrays: Mapping[str, np.ndarray], sync_optimizer: bool) -> list[str]:
    """Names of the arrays shared by all learners after a synchronization (the rest stays per learner).

    >>> import numpy as np
    >>> sorted(synced_names({"trainer/weights/W": np.zeros(2), "trainer/optimizer/W__m": np.zeros(2),
    ...                      "scaler/mean": np.zeros(2), "scaler/m2": np.zeros(2), "scaler/count": np.zeros(())},
    ...                     False))
    ['scaler/count', 'scaler/m2', 'scaler/mean', 'trainer/weights/W']
    """
    stats = {f"{p}/{k}" for p in _stat_groups(list(arrays)) for k in _STATS + _SUMS}
    out = []
    for name, value in arrays.items():
        if not np.issubdtype(np.asarray(value).dtype, np.floating):
            continue
        if name.startswith(_WEIGHTS) or name in stats or (sync_optimizer and name.startswith(_OPTIMIZER)):
            out.append(name)
    return out


def mix(states: Sequence[Mapping[str, np.ndarray] | None], rows: Sequence[int],
        previous: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
    """One state from the learners' synced arrays (``None`` for a learner that trained nothing this round).

    ``rows`` are the rows each trained in the round; ``previous`` is the last mixed state (for the
    scaler merge); ``None`` when no learner trained.

    >>> import numpy as np
    >>> a = {"trainer/weights/W": np.array([1.0, 2.0], np.float32)}
    >>> b = {"trainer/weights/W": np.array([3.0, 6.0], np.float32)}
    >>> mix([a, b], [100, 300], None)["trainer/weights/W"]
    array([2.5, 5. ], dtype=float32)
    >>> mix([a, None], [100, 0], None)["trainer/weights/W"]
    array([1., 2.], dtype=float32)
    """
    live = [(s, n) for s, n in zip(states, rows) if s is not None and n > 0]
    if not live:
        return None
    total = float(sum(n for _, n in live))
    out: dict[str, np.ndarray] = {}
    names = list(live[0][0])
    groups = _stat_groups(names)
    stats = {f"{p}/{k}" for p in groups for k in _STATS + _SUMS}
    for name in names:
        if name in stats:
            continue
        first = np.asarray(live[0][0][name])
        acc = np.zeros(first.shape, np.float64)
        for state, n in live:
            acc += np.asarray(state[name], np.float64) * (n / total)
        out[name] = acc.astype(first.dtype)
    for prefix in groups:
        out.update(_merge_stats(prefix, [s for s, _ in live], previous))
    return out


def _merge_stats(prefix: str, states: Sequence[Mapping[str, np.ndarray]],
                 previous: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Previous global statistics plus every learner's delta since then (exact, in float64)."""
    first = states[0]
    count, mean_key, m2_key = (f"{prefix}/{k}" for k in _STATS)
    if previous is not None and all(k in previous for k in (count, mean_key, m2_key)):
        g_n = float(previous[count])
        g_mean = np.asarray(previous[mean_key], np.float64)
        g_m2 = np.asarray(previous[m2_key], np.float64)
    else:
        g_n, g_mean = 0.0, np.zeros_like(np.asarray(first[mean_key], np.float64))
        g_m2 = np.zeros_like(g_mean)
    n, mean, m2 = g_n, g_mean.copy(), g_m2.copy()
    for state in states:
        s_n = float(state[count])
        s_mean = np.asarray(state[mean_key], np.float64)
        s_m2 = np.asarray(state[m2_key], np.float64)
        d_n = s_n - g_n  # this learner's rows since the last merge
        if d_n <= 0:
            continue
        d_mean = (s_n * s_mean - g_n * g_mean) / d_n
        d_m2 = s_m2 - g_m2 - (g_n * d_n / s_n) * (g_mean - d_mean) ** 2
        both = n + d_n
        delta = d_mean - mean
        mean = mean + delta * (d_n / both)
        m2 = m2 + d_m2 + delta ** 2 * (n * d_n / both)
        n = both
    out = {count: np.asarray(n, np.asarray(first[count]).dtype),
           mean_key: mean.astype(np.asarray(first[mean_key]).dtype),
           m2_key: m2.astype(np.asarray(first[m2_key]).dtype)}
    shift, s1, s2 = (f"{prefix}/{k}" for k in _SUMS)
    if all(k in first for k in (shift, s1, s2)):  # deviations measured from the merged mean: s1 = 0, s2 = m2
        out[shift] = mean.astype(np.asarray(first[shift]).dtype)
        out[s1] = np.zeros_like(mean, np.asarray(first[s1]).dtype)
        out[s2] = m2.astype(np.asarray(first[s2]).dtype)
    return out
