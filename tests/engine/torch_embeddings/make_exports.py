"""Export small models with PyTorch's ``nn.EmbeddingBag`` and ``nn.Embedding``, with both exporters.

Run with torch (not a streamfit dependency), from the repository root:

    /work/venv-torch/bin/python tests/engine/torch_embeddings/make_exports.py

Writes ``<name>.legacy.onnx`` (``torch.onnx.export(dynamo=False)``, opset 17) and ``<name>.dynamo.onnx``
(``dynamo=True``) beside this file, and prints the op types of each graph, so what the sparse path has to
recognise is on record (``tests/engine/test_sparse_torch.py`` trains them).  An exporter that fails is
reported and skipped.  Seeded: a re-run writes the same weights.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import Counter
from pathlib import Path

import onnx
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
ROWS, DIM, BAG = 60, 8, 4


class Bag2d(nn.Module):
    """EmbeddingBag over a 2-D input: every row of ``ids`` is one bag of ``BAG`` ids."""

    def __init__(self, mode: str, padding_idx: int | None = None) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(ROWS, DIM, mode=mode, padding_idx=padding_idx)
        self.head = nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(ids))


class BagOffsets(nn.Module):
    """EmbeddingBag over a flat ``ids`` input with ``offsets`` (bag k = ids[offsets[k]:offsets[k + 1]])."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(ROWS, DIM, mode=mode)
        self.head = nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(ids, offsets))


class Embed(nn.Module):
    """nn.Embedding, its rows flattened into a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(ROWS, DIM)
        self.head = nn.Linear(3 * DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.emb(ids), 1))


MODELS = {
    "bag_sum_2d": (lambda: Bag2d("sum"), ("ids",), lambda n: (torch.randint(0, ROWS, (n, BAG)),)),
    "bag_mean_2d": (lambda: Bag2d("mean"), ("ids",), lambda n: (torch.randint(0, ROWS, (n, BAG)),)),
    "bag_mean_2d_padding": (lambda: Bag2d("mean", padding_idx=0), ("ids",), lambda n: (torch.randint(0, ROWS, (n, BAG)),)),
    "bag_sum_offsets": (lambda: BagOffsets("sum"), ("ids", "offsets"),
                        lambda n: (torch.randint(0, ROWS, (n * BAG,)), torch.arange(n) * BAG)),
    "bag_mean_offsets": (lambda: BagOffsets("mean"), ("ids", "offsets"),
                         lambda n: (torch.randint(0, ROWS, (n * BAG,)), torch.arange(n) * BAG)),
    "embedding": (Embed, ("ids",), lambda n: (torch.randint(0, ROWS, (n, 3)),)),
}


def export(name: str) -> None:
    make, in_names, example = MODELS[name]
    torch.manual_seed(sum(map(ord, name)))
    model = make().eval()
    args = example(4)
    for exporter in ("legacy", "dynamo"):
        path = HERE / f"{name}.{exporter}.onnx"
        kwargs: dict = {"input_names": list(in_names), "output_names": ["y"]}
        if exporter == "legacy":
            kwargs["opset_version"] = 17
            kwargs["dynamic_axes"] = {**{n: {0: f"{n}_len"} for n in in_names}, "y": {0: "N"}}
        else:
            kwargs["dynamic_shapes"] = tuple({0: torch.export.Dim(f"{n}_len", min=2)} for n in in_names)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(model, args, str(path), dynamo=exporter == "dynamo", **kwargs)
            proto = onnx.load(str(path))
            for stale in HERE.glob(f"{path.name}*.data"):
                stale.unlink()
            onnx.save(proto, str(path))
            ops = Counter(n.op_type for n in proto.graph.node)
            print(f"{name}.{exporter}: {dict(sorted(ops.items()))}")
        except Exception as exc:  # report and go on
            print(f"{name}.{exporter}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
            path.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    for name in argv or list(MODELS):
        export(name)
    return 0


if __name__ == "__main__":
    os.chdir(HERE)
    sys.exit(main(sys.argv[1:]))
