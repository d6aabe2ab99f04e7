"""Export the zoo: small PyTorch architectures, each with both exporters, and the reference outputs.

Run with torch (not a streamfit dependency), from the repository root:

    python3.11 -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch==2.13.0 onnx onnxscript numpy
    /work/venv-torch/bin/python tests/zoo/make_zoo.py            # all models
    /work/venv-torch/bin/python tests/zoo/make_zoo.py mlp_relu   # some

Writes ``tests/zoo/<name>.legacy.onnx`` (``torch.onnx.export(dynamo=False)``), ``<name>.dynamo.onnx``
(``dynamo=True``; with ``optimize=False`` for models with BatchNorm, which the optimizer would fold into the
layer before it), for models with BatchNorm or Dropout also ``<name>.legacy_train.onnx`` (exported with
``training=TrainingMode.TRAINING``: BatchNormalization in training mode, Dropout nodes kept), and ``<name>.npz``: the eval inputs ``in_<input>`` and PyTorch's eval outputs ``out_<i>``; for
models with BatchNorm also the training batches ``train<k>_<input>`` and every BatchNorm's running statistics
after PyTorch ran those batches in train mode (``bn_<module path>_mean`` / ``_var``, momentum ``bn_momentum``).
Everything is seeded, so a re-run writes the same weights (up to the exporters' own changes).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
N_EVAL = 23  # rows of the reference batch (odd on purpose)
BN_BATCHES = (16, 16, 7)  # rows of the train-mode batches run for the running statistics


@dataclass(frozen=True)
class Spec:
    """One architecture: a module factory, its inputs (name, per-row shape, 'float' or id range), outputs."""

    make: Callable[[], nn.Module]
    inputs: tuple[tuple[str, tuple[int, ...], "str | int"], ...]
    outputs: tuple[str, ...] = ("y",)
    task: str = "regression"  # or "classification": the first output is logits
    external_data: bool = False


def mlp(act: Callable[[], nn.Module], d: int = 6) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(nn.Linear(d, 16), act(), nn.Linear(16, 12), act(), nn.Linear(12, 1))


class LayerNormGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(nn.functional.gelu(self.norm(self.inp(x))))


class BatchNormMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn1 = nn.BatchNorm1d(16, momentum=0.2)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.bn1(self.fc1(x)))))


class Conv2dNet(nn.Module):
    """Conv2d + BatchNorm2d + ReLU + a pooling + Dropout + linear head on 1x8x8 images."""

    def __init__(self, pool: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4) if pool != "max_nobn" else nn.Identity()
        self.pool = {"max": nn.MaxPool2d(2), "max_nobn": nn.MaxPool2d(2), "avg": nn.AvgPool2d(2),
                     "global": nn.AdaptiveAvgPool2d(1)}[pool]
        self.drop = nn.Dropout(0.1)
        width = 4 if pool == "global" else 4 * 4 * 4
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.head(self.drop(torch.flatten(h, 1)))


class Conv1dNet(nn.Module):
    def __init__(self, pool: str) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, padding=1)
        self.pool = {"max": nn.MaxPool1d(2), "avg": nn.AvgPool1d(2), "global": nn.AdaptiveMaxPool1d(1)}[pool]
        width = 4 if pool == "global" else 4 * 6
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(torch.tanh(self.conv(x))), 1))


class EmbeddingMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.mlp = nn.Sequential(nn.Linear(3 * 8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.flatten(self.emb(ids), 1))


class TwoTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.users = nn.Embedding(40, 8)
        self.items = nn.Embedding(30, 8)
        self.u = nn.Linear(8, 8)
        self.i = nn.Linear(8, 8)

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        u = self.u(self.users(user).squeeze(1))
        i = self.i(self.items(item).squeeze(1))
        return (u * i).sum(dim=1, keepdim=True)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.1,
                                                batch_first=True)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x).mean(dim=1))


class Recurrent(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[kind](input_size=3, hidden_size=8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class MultiOutput(nn.Module):
    """A shared trunk and two heads: a regression output and class logits."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.value = nn.Linear(16, 2)
        self.logits = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.value(h), self.logits(h)


def classifier() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))


ZOO: dict[str, Spec] = {
    **{f"mlp_{name}": Spec(mlp(act), (("x", (6,), "float"),)) for name, act in {
        "relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU, "elu": nn.ELU,
        "leakyrelu": lambda: nn.LeakyReLU(0.1), "silu": nn.SiLU, "softplus": nn.Softplus, "selu": nn.SELU,
        "hardtanh": nn.Hardtanh, "relu6": nn.ReLU6, "mish": nn.Mish}.items()},
    "layernorm_gelu": Spec(LayerNormGelu, (("x", (8,), "float"),)),
    "batchnorm1d_dropout": Spec(BatchNormMLP, (("x", (8,), "float"),)),
    "conv2d_bn_maxpool": Spec(lambda: Conv2dNet("max"), (("x", (1, 8, 8), "float"),)),
    "conv2d_bn_avgpool": Spec(lambda: Conv2dNet("avg"), (("x", (1, 8, 8), "float"),)),
    "conv2d_bn_globalpool": Spec(lambda: Conv2dNet("global"), (("x", (1, 8, 8), "float"),)),
    "conv1d_maxpool": Spec(lambda: Conv1dNet("max"), (("x", (2, 12), "float"),)),
    "conv1d_avgpool": Spec(lambda: Conv1dNet("avg"), (("x", (2, 12), "float"),)),
    "conv1d_globalpool": Spec(lambda: Conv1dNet("global"), (("x", (2, 12), "float"),)),
    "embedding_mlp": Spec(EmbeddingMLP, (("ids", (3,), 50),)),
    "two_tower": Spec(TwoTower, (("user", (1,), 40), ("item", (1,), 30))),
    "transformer_encoder": Spec(Encoder, (("x", (5, 16), "float"),)),
    "gru": Spec(lambda: Recurrent("gru"), (("x", (4, 3), "float"),)),
    "lstm": Spec(lambda: Recurrent("lstm"), (("x", (4, 3), "float"),)),
    "multi_output": Spec(MultiOutput, (("x", (6,), "float"),), outputs=("value", "logits")),
    "classifier_logits": Spec(classifier, (("x", (6,), "float"),), task="classification"),
    "mlp_external_data": Spec(mlp(nn.ReLU, d=20), (("x", (20,), "float"),), external_data=True),
}


def sample(spec: Spec, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name, shape, kind in spec.inputs:
        if kind == "float":
            out[name] = rng.standard_normal((n,) + shape).astype(np.float32)
        else:
            out[name] = rng.integers(0, int(kind), (n,) + shape).astype(np.int64)
    return out


def _tensors(batch: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(v) for v in batch.values())


def export(name: str, spec: Spec) -> None:
    torch.manual_seed(sum(map(ord, name)))
    model = spec.make().eval()
    rng = np.random.default_rng(sum(map(ord, name)))
    example = _tensors(sample(spec, 4, rng))
    in_names = [i[0] for i in spec.inputs]
    arrays: dict[str, np.ndarray] = {}
    bns = {path: m for path, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    if bns:  # give the running statistics non-trivial values first, so eval outputs depend on them
        model.train()
        with torch.no_grad():
            for _ in range(3):
                model(*_tensors(sample(spec, 32, rng)))
        model.eval()
    # the exported model (its weights and statistics as they are now)
    state = {k: v.clone() for k, v in model.state_dict().items()}  # exports in train mode move BN statistics
    has_dropout = any(isinstance(m, nn.Dropout) for m in model.modules())
    exporters = ("legacy", "dynamo") + (("legacy_train",) if bns or has_dropout else ())
    for exporter in exporters:
        path = HERE / f"{name}.{exporter}.onnx"
        kwargs: dict = {"input_names": in_names, "output_names": list(spec.outputs)}
        if exporter.startswith("legacy"):
            kwargs["dynamic_axes"] = {n: {0: "N"} for n in in_names + list(spec.outputs)}
            kwargs["opset_version"] = 17
            if exporter == "legacy_train":
                kwargs["training"] = torch.onnx.TrainingMode.TRAINING
                kwargs["do_constant_folding"] = False
        else:
            kwargs["optimize"] = not bns
            batch = torch.export.Dim("N", min=1)
            kwargs["dynamic_shapes"] = tuple({0: batch} for _ in in_names)  # positional: names differ
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, example, str(path), dynamo=exporter == "dynamo", **kwargs)
        model.load_state_dict(state)
        model.eval()  # the training-mode export leaves the module in train mode
        proto = onnx.load(str(path))  # dynamo may write external data itself: one file unless asked
        if exporter == "legacy_train":  # tracing in train mode moved the running statistics: put them back
            for init in proto.graph.initializer:
                if init.name in state:
                    init.CopyFrom(onnx.numpy_helper.from_array(state[init.name].numpy(), init.name))
        for stale in HERE.glob(f"{name}.{exporter}.onnx*.data"):
            stale.unlink()
        if spec.external_data:
            onnx.save(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                      location=f"{path.name}.data", size_threshold=0)
        else:
            onnx.save(proto, str(path))
    with torch.no_grad():
        eval_in = sample(spec, N_EVAL, rng)
        outs = model(*_tensors(eval_in))
        outs = outs if isinstance(outs, tuple) else (outs,)
    arrays.update({f"in_{k}": v for k, v in eval_in.items()})
    arrays.update({f"out_{i}": o.numpy() for i, o in enumerate(outs)})
    if bns:  # PyTorch's running statistics after these batches in train mode (from the exported state)
        model.train()
        for k, rows in enumerate(BN_BATCHES):
            batch = sample(spec, rows, rng)
            arrays.update({f"train{k}_{n}": v for n, v in batch.items()})
            with torch.no_grad():
                model(*_tensors(batch))
        for path, bn in bns.items():
            arrays[f"bn_{path}_mean"] = bn.running_mean.numpy().copy()
            arrays[f"bn_{path}_var"] = bn.running_var.numpy().copy()
        arrays["bn_momentum"] = np.array([bn.momentum for bn in bns.values()], np.float64)
    arrays["meta"] = np.array(json.dumps({"inputs": in_names, "outputs": list(spec.outputs), "task": spec.task,
                                          "batchnorm": sorted(bns), "torch": torch.__version__}))
    np.savez(HERE / f"{name}.npz", **arrays)


def main(argv: list[str]) -> int:
    names = argv or list(ZOO)
    for name in names:
        try:
            export(name, ZOO[name])
            print(f"{name}: ok")
        except Exception as exc:  # report and go on: one exporter failure should not hide the others
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
    return 0


if __name__ == "__main__":
    os.chdir(HERE)
    sys.exit(main(sys.argv[1:]))
