"""onnxruntime's errors from building or running a step, as a :class:`~streamfit.exceptions.ModelError` that
names the node and the reason, never the raw ``RuntimeException`` (``Fail``, ``InvalidArgument``, ...).

The node is read from the message where onnxruntime names it (``Name:'sf_u_Sub_94'``), else the nodes of the
op type a kernel message names (``LSTM and LSTMGrad kernel only supports ...``) are looked up in the model.
"""

from __future__ import annotations

import re

from onnx import ModelProto

from streamfit.exceptions import ModelError, StreamfitError

__all__ = ["as_model_error"]

_NODE = re.compile(r"[Nn]ame:\s*'([^']+)'")
_OP = re.compile(r"\b([A-Z][A-Za-z0-9]+?)(?:Grad|Training)?\b(?= (?:and \w+ )?kernel)")


def _reason(text: str) -> str:
    """The informative part of an onnxruntime message: past the source location and the status code."""
    text = text.strip().replace("\n", " ")
    text = re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"/onnxruntime_src/\S+ \S+ ", "", text)
    text = re.sub(r"\S+\.cc:\d+ ", "", text)
    return text[:600]


def as_model_error(exc: BaseException, what: str, model: ModelProto | None = None) -> StreamfitError:
    """``exc`` (raised while ``what``: "building the fused step", "running the forward/backward step") as a
    ModelError naming the node; streamfit's own errors are returned as they are."""
    if isinstance(exc, StreamfitError):
        return exc
    text = str(exc)
    node = _NODE.search(text)
    where = f" at node {node.group(1)!r}" if node else ""
    if not node and model is not None:
        op = _OP.search(text)
        if op:
            names = [n.name or n.output[0] for n in model.graph.node if n.op_type == op.group(1)]
            if names:
                where = f" at {op.group(1)} node{'s' if len(names) > 1 else ''} {', '.join(map(repr, names[:5]))}"
    return ModelError(f"onnxruntime failed {what}{where}: {_reason(text)}")
