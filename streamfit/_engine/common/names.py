"""The names streamfit gives the inputs, outputs and metadata it adds to the graphs it builds.

One home for them: the builders (``steps.step_graphs``, ``steps.sparse_tables``, ``prepare.running_stats``,
``gradient.rewrites``, ``gradient.autodiff``, the ready-made models' graphs) write these names and the steps
(``steps.fused``, ``steps.forward_backward``) and the estimators bind or look for them, so a name changes in one place and two builders cannot pick the same one.
Every name starts with ``sf_`` (model inputs and weights never should) or is a suffix of a model name
(``<weight>__new``).  Not listed: the names one builder makes up for its own intermediate tensors and
constants (``GraphBuilder(prefix="sf_f_")``, ``sf_ad_<hint>_<n>``), which nothing else reads.
"""

from __future__ import annotations

__all__ = ["Names"]


class Names:
    """Names of the inputs, outputs and metadata entries streamfit adds to a graph.

    >>> Names.slot("W0", "m"), Names.new("W0"), Names.grad("W0"), Names.scalar("lr")
    ('W0__m', 'W0__new', 'W0__grad', 'sf_lr')
    >>> Names.slot_owner(Names.slot("fc__w", "m")), Names.axes([0]), Names.reduce("b_grad"), Names.rows_dim("E", 0, 1)
    ('fc__w', 'sf_axes_0', 'sf_b_grad_reduce', 'sf_E_0_d1')
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
    # constants the gradient rewrites and streamfit's own gradient builder both add (shared by name)
    one = "sf_one"  # 1 (TanhGrad, SigmoidGrad spelled out)
    zero = "sf_zero"  # 0 (the ReluGrad mask's lower clip)
    relu_big = "sf_relu_big"  # 2**1022: the float64 ReluGrad mask clip(Y * relu_big, 0, 1)
    #: model metadata: what the fused step checks itself, as canonical JSON (see :mod:`~streamfit._engine.steps.check_plan`)
    check_plan_key = "streamfit.checks"
    dropout_off = "sf_dropout_off"  # the inference copy's bool False initializer: every Dropout's training_mode
    batch_dim = "sf_batch"  # the symbol given to an unnamed batch dimension of a graph input (shape analysis)
    # the ready-made models' graphs (streamfit.models._graphs): the input scaling, exported with the model
    scaler_mean = "sf_mean"  # initializers of X -> (X - mean) / scale, the estimators' host tensors
    scaler_scale = "sf_scale"
    centered = "sf_centered"  # X - mean
    standardized = "sf_standardized"  # (X - mean) / scale, what the layers read
    # ... and the targets mapped back: Y = standardized_output * target_scale + target_mean
    standardized_output = "sf_standardized_output"
    target_scaled = "sf_target_scaled"
    target_mean = "sf_target_mean"
    target_scale = "sf_target_scale"

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

    @staticmethod
    def slot_owner(name: str) -> str:
        """The weight a :meth:`slot` name belongs to (``"W0__m"`` -> ``"W0"``; ``""`` for another name)."""
        return name.rpartition("__")[0]

    @staticmethod
    def rows_dim(table: str, use: int, dim: int) -> str:
        """The symbol of dimension ``dim`` of the rows input of a sparse table's ``use``-th Gather, where the
        ids input's own dimension has none (``"emb", 0, 1`` -> ``sf_emb_0_d1``)."""
        return f"sf_{table}_{use}_d{dim}"

    @staticmethod
    def axes(axes: "tuple[int, ...] | list[int]") -> str:
        """The int64 constant holding the ``axes`` of a gradient's ``ReduceSum`` (``[0]`` -> ``sf_axes_0``)."""
        return "sf_axes_" + "_".join(map(str, axes))

    @staticmethod
    def reduce(output: str) -> str:
        """The name of the ``ReduceSum`` node that sums a gradient over leading axes into ``output`` (a bias's
        gradient); :func:`~streamfit._engine.gradient.rewrites.bias_grads_as_matmul` looks for these nodes."""
        return f"sf_{output}_reduce"

    @staticmethod
    def is_reduce(node_name: str) -> bool:
        """Whether ``node_name`` is a :meth:`reduce` name."""
        return node_name.startswith("sf_") and node_name.endswith("_reduce")
