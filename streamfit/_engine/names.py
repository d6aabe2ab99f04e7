"""The names streamfit gives the inputs, outputs and metadata it adds to the graphs it builds.

One home for them: the builders (``build``, ``sparse``, ``running_stats``, ``rewrites``) write these names and
the steps (``fused``, ``forward_backward``) bind them, so a name changes in one place.  Every name starts
with ``sf_`` (model inputs and weights never should) or is a suffix of a model name (``<weight>__new``).
"""

from __future__ import annotations

__all__ = ["Names"]


class Names:
    """Names of the inputs, outputs and metadata entries streamfit adds to a graph.

    >>> Names.slot("W0", "m"), Names.new("W0"), Names.grad("W0"), Names.scalar("lr")
    ('W0__m', 'W0__new', 'W0__grad', 'sf_lr')
    """

    target = "sf_target"
    loss_weight = "sf_loss_weight"  # per row: loss_factor * sample_weight / N
    grad_weight = "sf_grad_weight"  # per row: scale * sample_weight / N (scale = lr in the fused SGD step)
    decay = "sf_decay"  # 1 - lr * l2: the fused SGD step's weight decay factor
    loss = "sf_loss"
    check = "sf_check"  # one finiteness-check scalar; or several, sf_check_<i>, all of which must be finite
    bound_in0 = "sf_bound0_"  # + i: sums of squares of the first operands of the bounded weights' gradient Gemms
    bound_in1 = "sf_bound1_"  # + i: ... and of their second operands
    y = "sf_y"  # the loss graph's input: the model's output (forward/backward strategy)
    dy = "sf_dy"  # the loss graph's output: dL/dY
    ones = "sf_ones"  # a batch-long vector of ones (bias gradients as a GEMV, see rewrites.bias_grads_as_matmul)
    #: model metadata: what the fused step checks itself, as canonical JSON (see :mod:`~streamfit._engine.checkplan`)
    check_plan_key = "streamfit.checks"

    @staticmethod
    def scalar(name: str) -> str:
        """The graph input of an optimizer's per-step scalar (``"lr"`` -> ``sf_lr``)."""
        return f"sf_{name}"

    @staticmethod
    def slot(weight: str, slot: str) -> str:
        """The graph input of one optimizer state slot of ``weight``."""
        return f"{weight}__{slot}"

    @staticmethod
    def new(name: str) -> str:
        """The graph output holding the updated value of a weight or state slot."""
        return f"{name}__new"

    @staticmethod
    def grad(weight: str) -> str:
        """The update graph's input holding the gradient of ``weight`` (forward/backward strategy)."""
        return f"{weight}__grad"

    @staticmethod
    def table(table: str, what: str) -> str:
        """Names of a sparse table's pieces in the rows update graph (``rows``, ``inv``, ``grad<j>``)."""
        return f"{table}__{what}"
