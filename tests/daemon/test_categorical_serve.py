"""`streamfit train|serve` of the categorical models: hashed linear models, FTRL and factorization machines
chosen by flags or by the TOML config, on Parquet files with string, dictionary and integer columns.

Each run is compared with the library's own ``partial_fit`` on the same batches (weights and the exported
model on the raw columns), a SIGKILLed ``serve`` resumes to the uninterrupted run's weights, and a misspelt
option fails before any row is read.
"""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import streamfit
from streamfit.checkpoint import CheckpointStore
from streamfit.cli import main
from streamfit.daemon.config import load_config
from streamfit.daemon.state import flatten_state
from streamfit.exceptions import OptionError
from streamfit.optim import FTRL
from tests.daemon.test_serve import _cli, _health, _kill, _wait

CATEGORICAL, DENSE = ["site", "app", "device"], ["price", "hour"]
BATCH = 64


def write_clicks(root: Path, files: int = 3, rows: int = 512, seed: int = 0) -> Path:
    """Parquet files: ``site`` strings, ``app`` a dictionary column, ``device`` int64 (large ids), dense ``price``
    and ``hour`` (float32), a 0/1 ``label`` from a known logistic model of them."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sites = np.array([f"site-{i}" for i in range(40)], dtype=object)
    apps = [f"app-{i}" for i in range(12)]
    site_effect, app_effect = rng.standard_normal(40), rng.standard_normal(12)
    for i in range(files):
        s, a = rng.integers(0, 40, rows), rng.integers(0, 12, rows)
        device = rng.integers(0, 1_000_000, rows) % 97 * 1_000_003
        price = rng.standard_normal(rows).astype(np.float32)
        hour = rng.integers(0, 24, rows).astype(np.int32)
        logit = site_effect[s] + app_effect[a] + 0.5 * price + (device % 2 == 0) - 0.5
        label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
        table = pa.table({"site": pa.array(sites[s], pa.string()),
                          "app": pa.DictionaryArray.from_arrays(pa.array(a, pa.int32()), pa.array(apps)),
                          "device": pa.array(device, pa.int64()), "price": price,
                          "hour": pa.array(hour.astype(np.float32)), "label": label})
        pq.write_table(table, data / f"part-{i:03d}.parquet", row_group_size=200)
    return data


def batches(data: Path, size: int = BATCH) -> list[pa.Table]:
    """The rows of the files, in the daemon's order, cut into its training batches."""
    table = pa.concat_tables([pq.read_table(p) for p in sorted(data.glob("*.parquet"))])
    return [table.slice(i, size) for i in range(0, table.num_rows, size)]


def reference(estimator, data: Path):
    for b in batches(data):
        estimator.partial_fit(b.drop(["label"]), b.column("label").to_numpy(), classes=[0, 1])
    return estimator


def weights_of(estimator) -> dict[str, np.ndarray]:
    _, arrays = flatten_state(estimator.state_dict())
    return {k: v for k, v in arrays.items() if k.startswith("trainer/weights/")}


def checkpoint_weights(ck: Path) -> tuple[dict[str, np.ndarray], dict]:
    ckpt = CheckpointStore(ck).load_latest()
    return {k: v for k, v in ckpt.arrays.items() if k.startswith("trainer/weights/")}, ckpt.meta


def assert_same(got: dict, want: dict, rtol: float = 1e-5) -> None:
    assert sorted(got) == sorted(want) and want
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=rtol, atol=1e-6, err_msg=name)


def raw_feed(table: pa.Table, session: ort.InferenceSession) -> dict[str, np.ndarray]:
    """The exported model's inputs from the raw columns (strings as objects, integers and floats as they are)."""
    feed = {}
    for inp in session.get_inputs():
        col = table.column(inp.name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        values = col.to_numpy(zero_copy_only=False)
        feed[inp.name] = values.astype(object) if inp.type == "tensor(string)" else values
    return feed


def test_train_a_hashed_logistic_regression_from_flags_equals_partial_fit(tmp_path, capsys):
    data = write_clicks(tmp_path)
    out = tmp_path / "model.onnx"
    code = main(["train", "--source", f"parquet:{data}", "--estimator", "LogisticRegression",
                 "--categorical", ",".join(CATEGORICAL), "--dense", ",".join(DENSE), "--buckets", "4096",
                 "--hash-seed", "7", "--optimizer", "adagrad", "--eta0", "0.1", "--penalty", "none",
                 "--label", "label", "--classes", "0,1", "--batch-size", str(BATCH), "--threads", "1",
                 "--checkpoint-dir", str(tmp_path / "ck"), "-o", str(out), "--publish", str(tmp_path / "pub.onnx"),
                 "--no-progress"])
    assert code == 0, capsys.readouterr().err
    ref = reference(streamfit.LogisticRegression(categorical=CATEGORICAL, dense=DENSE, buckets=4096, hash_seed=7,
                                                 optimizer="adagrad", eta0=0.1, penalty=None, batch_size=BATCH,
                                                 threads=1), data)
    weights, meta = checkpoint_weights(tmp_path / "ck")
    assert meta["rows"] == 3 * 512 and meta["estimator"]["class"] == "LogisticRegression"
    assert_same(weights, weights_of(ref))
    # the exported model takes the raw columns (string, dictionary, int64, floats) and hashes them itself
    session = ort.InferenceSession(str(out))
    assert sorted(i.name for i in session.get_inputs()) == sorted(CATEGORICAL + DENSE)
    test = batches(data, 300)[1]
    scores = session.run(None, raw_feed(test, session))[0]
    np.testing.assert_allclose(scores.reshape(len(test)), ref.decision_function(test.drop(["label"])).reshape(len(test)),
                               rtol=1e-5, atol=1e-6)
    # the checkpoint's and the published model are the same raw-column model
    ckpt_model = onnx.load_from_string(CheckpointStore(tmp_path / "ck").load_latest().model_bytes)
    assert sorted(i.name for i in ckpt_model.graph.input) == sorted(CATEGORICAL + DENSE)
    for other in (ckpt_model.SerializeToString(), str(tmp_path / "pub.onnx")):
        again = ort.InferenceSession(other)
        np.testing.assert_allclose(again.run(None, raw_feed(test, again))[0], scores, rtol=1e-6, atol=1e-7)


def test_ftrl_from_the_config_file_equals_partial_fit(tmp_path, capsys):
    data = write_clicks(tmp_path, seed=1)
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'source = "parquet:{data}"\ncheckpoint_dir = "{tmp_path / "ck"}"\n'
                   'estimator = "LogisticRegression"\n'
                   f'categorical = {CATEGORICAL!r}\ndense = ["price"]\nbuckets = 2048\nhash_seed = 3\n'.replace("'", '"')
                   + 'optimizer = "ftrl"\neta0 = 0.2\nftrl_beta = 0.5\nftrl_l1 = 0.3\nftrl_l2 = 0.1\npenalty = "none"\n'
                   f'label = "label"\nclasses = [0, 1]\nbatch_size = {BATCH}\nthreads = 1\n')
    assert main(["train", "--config", str(cfg), "--no-progress"]) == 0, capsys.readouterr().err
    ref = reference(streamfit.LogisticRegression(categorical=CATEGORICAL, dense=["price"], buckets=2048, hash_seed=3,
                                                 optimizer=FTRL(beta=0.5, l1=0.3, l2=0.1), eta0=0.2, penalty=None,
                                                 batch_size=BATCH, threads=1), data)
    weights, meta = checkpoint_weights(tmp_path / "ck")
    assert meta["rows"] == 3 * 512
    assert_same(weights, weights_of(ref))
    table = next(v for k, v in weights.items() if v.ndim == 2 and v.shape[0] == 2048)
    assert (table == 0).mean() > 0.5  # l1 gives exact zeros: FTRL(l1=0.3) ran, not another rule
    # the configuration round-trips through its TOML form
    loaded = load_config(str(cfg), {})
    (tmp_path / "again.toml").write_text(loaded.to_toml())
    assert load_config(str(tmp_path / "again.toml"), {}) == loaded


SERVE_OPTS = ["--estimator", "FMClassifier", "--categorical", ",".join(CATEGORICAL), "--dense", "price,hour",
              "--buckets", "4096", "--n-factors", "4", "--random-state", "0", "--optimizer", "ftrl", "--eta0", "0.1",
              "--ftrl-l1", "0.05", "--label", "label", "--classes", "0,1", "--batch-size", "32", "--threads", "1",
              "--no-progress", "--checkpoint-every-batches", "8", "--full-every", "3"]


def test_serve_an_fm_with_ftrl_killed_and_resumed_equals_an_uninterrupted_run(tmp_path):
    data = write_clicks(tmp_path, files=4, rows=1024, seed=2)
    total = 4 * 1024
    ref = _cli("train", "--source", f"parquet:{data}", "--checkpoint-dir", str(tmp_path / "ref"), *SERVE_OPTS)
    _, err = ref.communicate(timeout=180)
    assert ref.returncode == 0, err
    ref_weights, ref_meta = checkpoint_weights(tmp_path / "ref")
    assert ref_meta["rows"] == total and ref_meta["estimator"]["class"] == "FMClassifier"
    # the files land one per run, so every run has new rows to train and checkpoints due before it is killed
    landing, files = tmp_path / "landing", sorted(data.glob("*.parquet"))
    landing.mkdir()

    def land(n: int) -> None:
        for f in files[:n]:
            if not (landing / f.name).exists():
                (landing / f"{f.stem}.tmp").write_bytes(f.read_bytes())
                (landing / f"{f.stem}.tmp").rename(landing / f.name)

    ck, health = tmp_path / "ck", tmp_path / "health.json"
    resume: list[str] = []
    for k, point in enumerate(("step", "files_written", "step")):
        land(k + 1)
        health.unlink(missing_ok=True)
        env = None
        if point != "step":
            marker = tmp_path / f"marker-{point}"
            env = {"STREAMFIT_CHECKPOINT_TEST_PAUSE": f"{point}:{marker}"}
        proc = _cli("serve", "--source", f"parquet:{landing}", "--checkpoint-dir", str(ck), "--health-file",
                    str(health), "--health-interval", "0", "--log-json", *SERVE_OPTS, *resume, env=env)
        if point == "step":  # in the middle of the file that landed last
            _wait(lambda: _health(health).get("rows", 0) >= k * 1024 + 320, proc, what="training progress")
        else:
            _wait(marker.exists, proc, what=f"checkpoint point {point}")
        _kill(proc)
        resume = ["--resume"]
    land(len(files))
    health.unlink(missing_ok=True)
    proc = _cli("serve", "--source", f"parquet:{landing}", "--checkpoint-dir", str(ck), "--health-file", str(health),
                "--health-interval", "0", "--log-json", *SERVE_OPTS, *resume)
    _wait(lambda: _health(health).get("rows", 0) >= total, proc, what="the whole stream")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert '"event": "resume"' in err
    weights, meta = checkpoint_weights(ck)
    assert meta["rows"] == total and meta["batches"] == ref_meta["batches"] == total // 32
    assert_same(weights, ref_weights)
    # and the uninterrupted run is the library's partial_fit on the same batches
    lib = streamfit.FMClassifier(categorical=CATEGORICAL, dense=["price", "hour"], buckets=4096, n_factors=4,
                                 random_state=0, optimizer=FTRL(l1=0.05), eta0=0.1, batch_size=32, threads=1)
    for b in batches(data, 32):
        lib.partial_fit(b.drop(["label"]), b.column("label").to_numpy(), classes=[0, 1])
    assert_same(ref_weights, weights_of(lib))


@pytest.mark.parametrize("toml, flags, message", [
    ('estimator = "FMClassifier"\ncategorical = ["site"]\nn_factor = 4\n', [],
     r"unknown (key|option) 'n_factor' \(did you mean 'n_factors'\?\)"),
    ('estimator = "LogisticRegresion"\n', [], r"Invalid estimator: 'LogisticRegresion'.*did you mean 'LogisticRegression'"),
    ('estimator = "LogisticRegression"\ncategorical = ["site"]\nn_factors = 4\n', [],
     r"n_factors is a parameter of FMRegressor, FMClassifier, not of LogisticRegression"),
    ('estimator = "LogisticRegression"\ncategorical = ["site"]\nftrl_l1 = 0.5\n', [],
     r"ftrl_l1 is a parameter of optimizer 'ftrl', but the optimizer is 'adam'"),
    ('estimator = "LogisticRegression"\nbuckets = "many"\n', [], r"Invalid buckets: 'many', expected an int"),
    ('estimator = "FMClassifier"\noptimizer = "ftrl"\nftrl_l1 = -1.0\n', [], r"ftrl.*l1"),
    ("", ["--estimator", "LogisticRegression", "--categorical", "site", "--hash-sead", "1"],
     r"unknown option --hash-sead \(did you mean --hash-seed\?\)"),
    ("", ["--estimator", "FMClassifier", "--optimizer", "adagrad", "--ftrl-beta", "2"],
     r"ftrl_beta is a parameter of optimizer 'ftrl'"),
    ("", ["--estimator", "LogisticRegression", "--model", "x.onnx"], r"builds its own graph"),
    ("", ["--estimator", "FMClassifier", "--categorical", "site", "--features", "price"],
     r"features = \.\.\. does not apply to FMClassifier over categorical columns"),
    ("", ["--estimator", "LogisticRegression", "--categorical", "site", "--dense", "site"],
     r"columns \['site'\] are both categorical and dense"),
])
def test_a_misspelt_or_misplaced_option_fails_before_any_row_is_read(tmp_path, capsys, toml, flags, message):
    import re

    data = write_clicks(tmp_path, files=1, rows=64)
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'source = "parquet:{data}"\nlabel = "label"\ncheckpoint_dir = "{tmp_path / "ck"}"\n' + toml)
    assert main(["train", "--config", str(cfg), "--no-progress", *flags]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "ck").exists()  # refused when the configuration was read: nothing trained or written
    if toml:  # the same refusal from the library side, as an OptionError naming the option
        with pytest.raises((OptionError, ValueError), match=message):
            load_config(str(cfg), {})


@pytest.mark.parametrize("changed, message", [
    (["--hash-seed", "8"], r"saved column plan.*a run keeps its columns"),
    (["--optimizer", "ftrl"], r"ResumeError: the checkpoint does not fit the configured FMClassifier: optimizer state"),
    (["--n-factors", "2"], r"ResumeError: .*factors"),
])
def test_a_resume_with_other_model_options_is_refused(tmp_path, capsys, changed, message):
    import re

    data = write_clicks(tmp_path, files=1, rows=128)
    run = ["train", "--source", f"parquet:{data}", "--label", "label", "--classes", "0,1", "--batch-size", "64",
           "--checkpoint-dir", str(tmp_path / "ck"), "--no-progress", "--estimator", "FMClassifier",
           "--categorical", "site,app", "--dense", "price", "--buckets", "1024", "--n-factors", "4", "--hash-seed", "7"]
    assert main(run) == 0
    capsys.readouterr()
    assert main([*run, "--resume", *changed]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert main([*run, "--resume"]) == 0  # the same options resume (the source is at its end: nothing to train)
