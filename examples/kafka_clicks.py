"""A click model from a Kafka topic (docs/tutorials/kafka-clicks.md as one script).

Produces ``ClickStream(seed=0)`` rows as Arrow IPC messages to a topic, trains a hashed
``LogisticRegression`` (FTRL-Proximal) from the topic with progressive validation, checks that the exported
ONNX model (the hashing inside its graph) predicts what the estimator predicts, and plots the calibration of
the predicted click rate on held-out rows to ``<out>/kafka_clicks.png``.

    python examples/kafka_clicks.py --out /tmp/plots                         # starts a local broker (tansu)
    python examples/kafka_clicks.py --bootstrap 127.0.0.1:9092 --rows 200000 --out /tmp/plots
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from streamfit import LogisticRegression, train_stream_sync  # noqa: E402
from streamfit.testing import ClickStream, LocalKafkaBroker  # noqa: E402


def main(out: Path, bootstrap: str | None, rows: int) -> None:
    stream = ClickStream(seed=0)
    with contextlib.ExitStack() as stack:
        if bootstrap is None:  # a tansu broker on a free loopback port, killed on exit
            broker = stack.enter_context(LocalKafkaBroker())
            bootstrap, topic = broker.bootstrap, broker.create_topic()
            query = "&".join(f"{k}={v}" for k, v in broker.consumer_config.items())
            broker.produce(topic, stream.kafka_messages(rows, rows_per_message=1024))
        else:
            from confluent_kafka import Producer

            topic, query = "clicks", ""
            producer = Producer({"bootstrap.servers": bootstrap})
            for value in stream.kafka_messages(rows, rows_per_message=1024):
                producer.produce(topic, value)
            producer.flush()
        ctr = LogisticRegression(categorical=stream.categorical, dense=stream.dense, buckets=2**18,
                                 optimizer="ftrl", eta0=0.1, batch_size=1024)
        uri = f"kafka://{bootstrap}/{topic}?group=ctr" + (f"&{query}" if query else "")
        summary = train_stream_sync(ctr, uri, label="label", batch_size=1024, classes=[0, 1], max_rows=rows)
    print(f"trained {summary.rows} rows from {topic}; progressive log loss "
          f"{summary.stream_metrics['log_loss']:.4f} (a coin: {np.log(2):.4f})")

    test = stream.batch(10_000_000, 20_000)  # rows far past the trained ones
    session = ort.InferenceSession(ctr.to_onnx().SerializeToString())
    feed = {i.name: test.column(i.name).to_numpy() for i in session.get_inputs()}
    exported = 1 / (1 + np.exp(-session.run(None, feed)[0].ravel()))
    p = ctr.predict_proba(test)[:, 1]
    np.testing.assert_allclose(exported, p, rtol=1e-4, atol=1e-6)
    print(f"exported ONNX model (hashing in its graph) agrees with the estimator: max |diff| "
          f"{np.abs(exported - p).max():.2e}")

    y = test.column("label").to_numpy()
    edges = np.quantile(p, np.linspace(0, 1, 11))
    which = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, 9)
    predicted = [p[which == b].mean() for b in range(10)]
    observed = [y[which == b].mean() for b in range(10)]
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], ":", color="grey", label="perfect calibration")
    ax.plot(predicted, observed, "o-", label=f"hashed LogisticRegression, FTRL ({summary.rows:,} rows)")
    ax.set(xlabel="predicted click rate (decile mean)", ylabel="observed click rate",
           title="Click model from Kafka: held-out calibration")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "kafka_clicks.png", dpi=100)
    print("plot:", out / "kafka_clicks.png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the plot")
    parser.add_argument("--bootstrap", help="a broker's HOST:PORT (default: start a local tansu broker)")
    parser.add_argument("--rows", type=int, default=20_480, help="rows to produce and train (default %(default)s)")
    args = parser.parse_args()
    main(args.out, args.bootstrap, args.rows)
