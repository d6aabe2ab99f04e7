"""Export the second zoo: torchvision and Hugging Face architectures at small widths, each exported both ways,
with a PyTorch twin's training run to compare against.

Run with torch (not a streamfit dependency), from anywhere:

    python3.11 -m venv /work/venv-torch
    /work/venv-torch/bin/pip install torch==2.13.0 onnx onnxscript numpy transformers torchvision==0.28
    /work/venv-torch/bin/python tests/zoo2/make_zoo2.py              # all models
    /work/venv-torch/bin/python tests/zoo2/make_zoo2.py bert tcn     # some (tcn, bilstm, bigru: torch alone)

Every model is built by its library's own constructor or config (random weights, seeded; never a download):
torchvision's ``MobileNetV3``, ``EfficientNet``, ``ConvNeXt`` and ResNet's ``BasicBlock`` at a few channels;
transformers' ``BertForSequenceClassification``, ``DistilBertForSequenceClassification`` and
``GPT2LMHeadModel`` at tiny configs (eager attention, an attention mask input); PyTorch's bidirectional
two-layer ``LSTM`` and ``GRU``; a small TCN (dilated causal ``Conv1d`` blocks with residuals, torch alone).

Writes ``<name>.legacy.onnx`` (``dynamo=False``, opset 17), ``<name>.dynamo.onnx`` (``dynamo=True``, opset
18), for models with BatchNorm, Dropout or stochastic depth also ``<name>.legacy_train.onnx`` (training
mode: BatchNormalization with batch statistics, Dropout and stochastic depth kept as random ops), and
``<name>.npz``: the eval inputs ``in_<input>`` and PyTorch's eval output ``out``; the twin's run: training
batches ``train<k>_<input>`` with targets ``train<k>_y`` (SGD, lr ``lr``, PyTorch's train mode with its
Dropout and stochastic depth off, as streamfit trains an eval-mode export), its losses ``twin_losses`` and its
eval output after those steps ``twin_out``; ``twin_out_untied`` for GPT-2, whose tied input and output
embeddings both exporters untie (the output one becomes a transposed copy, trained on its own).
torchvision's C ops are not loaded (its CUDA wheel does not load against the CPU torch): its model classes
are pure Python, imported with ``torch.library.register_fake`` made a no-op.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
N_EVAL = 11  # rows of the reference batch
TRAIN_BATCHES = (16, 16, 9)
LR = 0.05
SEQ = 8
VOCAB = 64


def _torchvision() -> Any:
    """torchvision's pure-Python model classes, without its C ops (see the module docstring)."""
    real = torch.library.register_fake

    def no_op(*args: Any, **kwargs: Any) -> Any:
        if args and callable(args[0]) and not isinstance(args[0], str):
            return args[0]
        return lambda fn=None, *a, **k: fn

    torch.library.register_fake = no_op  # type: ignore[assignment]
    try:
        import torchvision
    finally:
        torch.library.register_fake = real
    return torchvision


@dataclass(frozen=True)
class Spec:
    """One architecture: a module factory, its inputs (name, per-row shape, 'float' / 'mask' / id range), task."""

    make: Callable[[], nn.Module]
    inputs: tuple[tuple[str, tuple[int, ...], "str | int"], ...]
    task: str = "regression"  # or "classification": the output is logits
    classes: int = 1
    train_mode_export: bool = False  # BatchNorm, Dropout or stochastic depth: also a training-mode export
    untie: tuple[str, str] = ("", "")  # (tied parameter, its alias): the legacy exporter unties them
    opts: dict = field(default_factory=dict)


# -- CNNs (torchvision) --------------------------------------------------------------------------------

class Regressor(nn.Module):
    """A torchvision classifier with ``num_classes=1``: its logit is the regression output."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def mobilenet_v3() -> nn.Module:
    from torchvision.models.mobilenetv3 import InvertedResidualConfig as C, MobileNetV3

    # input_channels, kernel, expanded, out, use_se, activation, stride, dilation, width_mult
    setting = [C(8, 3, 8, 8, True, "RE", 2, 1, 1.0), C(8, 3, 16, 8, False, "HS", 1, 1, 1.0),
               C(8, 5, 16, 16, True, "HS", 2, 1, 1.0)]
    return Regressor(MobileNetV3(setting, last_channel=16, num_classes=1, dropout=0.2))


def efficientnet() -> nn.Module:
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig

    # expand_ratio, kernel, stride, input_channels, out_channels, num_layers
    setting = [MBConvConfig(1, 3, 1, 8, 8, 1), MBConvConfig(2, 3, 2, 8, 16, 2)]
    return Regressor(EfficientNet(setting, dropout=0.2, stochastic_depth_prob=0.3, num_classes=1, last_channel=16))


def convnext() -> nn.Module:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return Regressor(ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)], stochastic_depth_prob=0.3,
                              num_classes=1))


class TinyResNet(nn.Module):
    """ResNet's stem, two torchvision ``BasicBlock`` s (one downsampling), global pool, head."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models.resnet import BasicBlock

        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        down = nn.Sequential(nn.Conv2d(8, 16, 1, stride=2, bias=False), nn.BatchNorm2d(16))
        self.blocks = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 16, stride=2, downsample=down))
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


# -- transformers ----------------------------------------------------------------------------------------

class SequenceLogits(nn.Module):
    """A Hugging Face model called with ``input_ids`` and ``attention_mask``; its logits."""

    def __init__(self, model: nn.Module, last: bool = False) -> None:
        super().__init__()
        self.model = model
        self.last = last

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return logits[:, -1] if self.last else logits


def bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16, type_vocab_size=2, num_labels=3,
                     attn_implementation="eager")
    return SequenceLogits(BertForSequenceClassification(cfg))


def distilbert() -> nn.Module:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    cfg = DistilBertConfig(vocab_size=VOCAB, dim=16, n_layers=2, n_heads=2, hidden_dim=32, max_position_embeddings=16,
                           num_labels=3, attn_implementation="eager")
    return SequenceLogits(DistilBertForSequenceClassification(cfg))


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=16, attn_implementation="eager",
                     tie_word_embeddings=True)
    return SequenceLogits(GPT2LMHeadModel(cfg), last=True)


# -- recurrent -------------------------------------------------------------------------------------------

class BiRecurrent(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[kind](input_size=3, hidden_size=6, num_layers=2,
                                                          bidirectional=True, batch_first=True)
        self.head = nn.Linear(12, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


# -- temporal convolution ----------------------------------------------------------------------------------

class CausalBlock(nn.Module):
    """A TCN block: two dilated causal Conv1d (left padding (k-1)*dilation), ReLU, and a residual."""

    def __init__(self, channels_in: int, channels: int, dilation: int, k: int = 3) -> None:
        super().__init__()
        self.pad = (k - 1) * dilation
        self.conv1 = nn.Conv1d(channels_in, channels, k, dilation=dilation)
        self.conv2 = nn.Conv1d(channels, channels, k, dilation=dilation)
        self.skip = nn.Conv1d(channels_in, channels, 1) if channels_in != channels else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(nn.functional.pad(x, (self.pad, 0))))
        h = torch.relu(self.conv2(nn.functional.pad(h, (self.pad, 0))))
        return torch.relu(h + self.skip(x))


class TCN(nn.Module):
    """A small temporal convolutional net: causal blocks of dilation 1, 2, 4 over [N, 3, 16], the last step's
    features into a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(CausalBlock(3, 8, 1), CausalBlock(8, 8, 2), CausalBlock(8, 8, 4))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x)[:, :, -1])


IMAGE = (("x", (3, 16, 16), "float"),)
TEXT = (("input_ids", (SEQ,), VOCAB), ("attention_mask", (SEQ,), "mask"))
ZOO: dict[str, Spec] = {
    "mobilenet_v3": Spec(mobilenet_v3, IMAGE, train_mode_export=True),
    "efficientnet": Spec(efficientnet, IMAGE, train_mode_export=True),
    "convnext": Spec(convnext, IMAGE, train_mode_export=True),
    "resnet": Spec(TinyResNet, IMAGE, train_mode_export=True),
    "bert": Spec(bert, TEXT, "classification", 3),
    "distilbert": Spec(distilbert, TEXT, "classification", 3),
    "gpt2": Spec(gpt2, TEXT, "classification", VOCAB,
                 untie=("model.transformer.wte.weight", "model.lm_head.weight")),
    "bilstm": Spec(lambda: BiRecurrent("lstm"), (("x", (5, 3), "float"),)),
    "bigru": Spec(lambda: BiRecurrent("gru"), (("x", (5, 3), "float"),)),
    "tcn": Spec(TCN, (("x", (3, 16), "float"),)),
}
#: the architectures built from torch alone (no torchvision, no transformers needed to export them)
TORCH_ONLY = {"bilstm", "bigru", "tcn"}


def sample(spec: Spec, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name, shape, kind in spec.inputs:
        if kind == "float":
            out[name] = rng.standard_normal((n,) + shape).astype(np.float32)
        elif kind == "mask":  # each row: its first 3..SEQ positions real, the rest padding
            lengths = rng.integers(3, shape[0] + 1, n)
            out[name] = (np.arange(shape[0])[None, :] < lengths[:, None]).astype(np.int64)
        else:
            out[name] = rng.integers(0, int(kind), (n,) + shape).astype(np.int64)
    return out


def targets(spec: Spec, n: int, rng: np.random.Generator) -> np.ndarray:
    if spec.task == "classification":
        return rng.integers(0, spec.classes, n).astype(np.int64)
    return rng.standard_normal((n, 1)).astype(np.float32)


def _tensors(batch: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(v) for v in batch.values())


def _stochastic(m: nn.Module) -> bool:
    return isinstance(m, nn.Dropout) or type(m).__name__ == "StochasticDepth"


def twin_run(model: nn.Module, spec: Spec, batches: list[tuple[dict[str, np.ndarray], np.ndarray]],
             eval_in: dict[str, np.ndarray], untie: tuple[str, str] = ("", "")
             ) -> tuple[np.ndarray, np.ndarray]:
    """SGD steps as streamfit takes them (mean loss: 0.5 * squared error or softmax cross-entropy) in PyTorch's
    train mode with Dropout and stochastic depth off (eval mode for models without BatchNorm); the losses and
    the eval output after them."""
    model = copy.deepcopy(model)
    if untie[0]:
        owner, attr = untie[1].rsplit(".", 1)
        module = model.get_submodule(owner)
        setattr(module, attr, nn.Parameter(model.get_parameter(untie[0]).detach().clone()))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    for X, y in batches:
        model.train(has_bn)  # eval mode without BatchNorm: HF attention reads module.training for its dropout
        for m in model.modules():
            if _stochastic(m):
                m.eval()
        opt.zero_grad()
        out = model(*_tensors(X))
        if spec.task == "classification":
            loss = nn.functional.cross_entropy(out, torch.from_numpy(y))
        else:
            loss = 0.5 * ((out - torch.from_numpy(y)) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    model.eval()
    with torch.no_grad():
        return np.array(losses), model(*_tensors(eval_in)).numpy()


def _export_one(model: nn.Module, spec: Spec, example: tuple[torch.Tensor, ...], path: Path, exporter: str) -> None:
    in_names = [i[0] for i in spec.inputs]
    kwargs: dict = {"input_names": in_names, "output_names": ["y"]}
    if exporter.startswith("legacy"):
        kwargs["dynamic_axes"] = {n: {0: "N"} for n in in_names + ["y"]}
        kwargs["opset_version"] = 17
        if exporter == "legacy_train":
            kwargs["training"] = torch.onnx.TrainingMode.TRAINING
            kwargs["do_constant_folding"] = False
    else:
        kwargs["opset_version"] = 18
        batch = torch.export.Dim("N", min=1)
        kwargs["dynamic_shapes"] = tuple({0: batch} for _ in in_names)
    state = copy.deepcopy(model.state_dict())
    if exporter == "legacy_train":
        model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example, str(path), dynamo=exporter == "dynamo", **kwargs)
    model.load_state_dict(state)
    model.eval()
    proto = onnx.load(str(path))
    if exporter == "legacy_train":  # tracing in train mode moved the running statistics: put them back
        for init in proto.graph.initializer:
            if init.name in state:
                init.CopyFrom(onnx.numpy_helper.from_array(state[init.name].numpy(), init.name))
    for stale in path.parent.glob(f"{path.name}*.data"):
        stale.unlink()
    onnx.save(proto, str(path))  # one file (dynamo may write external data itself)


def export(name: str, spec: Spec) -> None:
    seed = sum(map(ord, name))
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = spec.make().eval()
    with torch.no_grad():  # no two parameters equal (fresh LayerNorm ones and zeros would be merged by the
        for p in model.parameters():  # legacy exporter into one initializer: trained tied), as after training
            p.add_(0.02 * torch.randn_like(p))
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if bns:  # running statistics that are not the initial ones, so eval outputs depend on them
        model.train()
        with torch.no_grad():
            for _ in range(3):
                model(*_tensors(sample(spec, 16, rng)))
        model.eval()
    example = _tensors(sample(spec, 4, rng))
    exporters = ("legacy", "dynamo") + (("legacy_train",) if spec.train_mode_export else ())
    for exporter in exporters:
        _export_one(model, spec, example, HERE / f"{name}.{exporter}.onnx", exporter)
    eval_in = sample(spec, N_EVAL, rng)
    with torch.no_grad():
        out = model(*_tensors(eval_in)).numpy()
    arrays: dict[str, np.ndarray] = {f"in_{k}": v for k, v in eval_in.items()}
    arrays["out"] = out
    batches = [(sample(spec, rows, rng), targets(spec, rows, rng)) for rows in TRAIN_BATCHES]
    for k, (X, y) in enumerate(batches):
        arrays.update({f"train{k}_{n}": v for n, v in X.items()})
        arrays[f"train{k}_y"] = y
    arrays["twin_losses"], arrays["twin_out"] = twin_run(model, spec, batches, eval_in)
    if spec.untie[0]:
        arrays["twin_losses_untied"], arrays["twin_out_untied"] = twin_run(model, spec, batches, eval_in,
                                                                          untie=spec.untie)
    meta = {"inputs": [i[0] for i in spec.inputs], "task": spec.task, "lr": LR, "batchnorm": len(bns),
            "untie": list(spec.untie), "torch": torch.__version__}
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(HERE / f"{name}.npz", **arrays)


def main(argv: list[str]) -> int:
    if set(argv or ZOO) - TORCH_ONLY:
        _torchvision()
        import transformers

        transformers.logging.set_verbosity_error()
    for name in argv or list(ZOO):
        try:
            export(name, ZOO[name])
            sizes = {p.name: p.stat().st_size for p in HERE.glob(f"{name}.*")}
            print(f"{name}: ok " + ", ".join(f"{k} {v / 1024:.0f} KB" for k, v in sorted(sizes.items())))
        except Exception as exc:  # report and go on: one exporter failure should not hide the others
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:400]}")
    return 0


if __name__ == "__main__":
    os.chdir(HERE)
    sys.exit(main(sys.argv[1:]))
