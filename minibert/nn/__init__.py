"""Parameters, modules and layers, each forward next to its hand-written backward.

Each layer function is written as its formula, and the formula is what runs. The jobs
switch on faster forms of the same formulas for GELU, softmax, LayerNorm and the
cross-entropy (:mod:`minibert.fast_cpu`) with :func:`minibert.fast.set_fast_paths`, and
say so in their log; a plain import, the examples and ``python -m minibert.gradcheck``
leave them off.
"""
from .activations import ACTIVATIONS, Activation, log_softmax, softmax_backward, softmax_forward
from .attention import (AttentionCache, attention_backward, attention_forward,
                        extended_attention_mask)
from .dropout import Dropout
from .embedding import Embedding, scatter_add_rows
from .flat import FlatParameters
from .layernorm import LayerNorm, layernorm_backward, layernorm_forward
from .linear import Linear, linear_backward, linear_forward
from .losses import (IGNORE_INDEX, cross_entropy_backward, cross_entropy_forward,
                     softmax_nll)
from .module import Module, ModuleList, Parameter
from .pooling import mean_pooling_backward, mean_pooling_forward

__all__ = [
    "ACTIVATIONS", "Activation", "AttentionCache", "Dropout", "Embedding", "FlatParameters",
    "IGNORE_INDEX",
    "LayerNorm", "Linear", "Module", "ModuleList", "Parameter", "attention_backward",
    "attention_forward", "cross_entropy_backward", "cross_entropy_forward",
    "extended_attention_mask", "layernorm_backward", "layernorm_forward", "linear_backward",
    "linear_forward", "log_softmax", "mean_pooling_backward", "mean_pooling_forward", "scatter_add_rows",
    "softmax_backward", "softmax_forward", "softmax_nll",
]
