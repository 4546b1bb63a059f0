"""Structured pruning of a teacher into a smaller student's starting weights.

Minitron (Muralidharan et al. 2024, "Compact Language Models via Pruning and Knowledge
Distillation", section 2) shrinks a trained Transformer along every axis at once, keeps
the units that matter most on a small calibration set, and then distils the pruned
model from the original. This module does the first two steps for BERT:

* :func:`activation_importance` runs the teacher forward on calibration batches and
  scores every hidden channel, attention head, feed-forward neuron and layer from the
  activations alone (no gradient), as Minitron section 2.2 does:

  - a hidden channel by the mean |value| of every LayerNorm output in that channel
    (Minitron's embedding-channel score, summed over the LayerNorms);
  - a head by the mean L2 norm of its slice of the attention context, the head's output
    before the output projection (Minitron's head score);
  - a neuron by the mean |activation| after GELU, the input of the down projection
    (Minitron scores the up projection's output; we score what the down projection
    multiplies, which is the neuron's actual contribution up to its weight column);
  - a layer by ShortGPT's block influence (Men et al. 2024, "ShortGPT", eq. 1), one minus
    the mean cosine between the hidden states the layer reads and those it writes:
    a layer that barely turns its input matters least.

  Every mean runs over the real (attention-mask) tokens of all batches. The residual
  stream comes from ``BertModel.forward(output_hidden_states=True)``; the activations
  inside a layer are recomputed from the layer's input by its sub-modules, forward only
  (:func:`layer_activations`).

* :func:`pruned_state` slices the teacher's weights down to the student's sizes, keeping
  the highest-scoring units in their original order (ties: the lower index), and
  :func:`pruned_config` builds the student's config. Heads are kept or dropped whole,
  so the student's head size equals the teacher's and the attention scale is unchanged.

Shape legend: Ct / Cs = teacher / student hidden size, H = heads, I = intermediate size,
L = layers, V = vocab.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from ..backend import get_array_module, to_numpy
from ..modeling import BertConfig, BertLayer, BertModel
from ..nn import extended_attention_mask
from .students import LAYER_KEY

__all__ = ["PRUNED_SIZES", "ActivationImportance", "activation_importance",
           "layer_activations", "pruned_config", "pruned_state", "top_indices"]

PRUNED_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads",
                "intermediate_size")


@dataclass
class ActivationImportance:
    """Scores of a teacher's units (float64 host arrays, larger = more important).

    hidden: (Ct,) per hidden channel. heads: (L, H) per layer and head.
    neurons: (L, I) per layer and feed-forward neuron. layers: (L,) block influence.
    """

    hidden: np.ndarray
    heads: np.ndarray
    neurons: np.ndarray
    layers: np.ndarray


def activation_importance(bert: BertModel, batches) -> ActivationImportance:
    """Score the units of ``bert`` on calibration ``batches`` (see the module docstring).

    Args:
        bert: a loaded :class:`~minibert.modeling.BertModel` (post- or pre-LN); it runs in
            inference mode (no dropout) and keeps its previous train/eval mode afterwards.
        batches: an iterable of objects with ``input_ids``, ``token_type_ids`` and
            ``attention_mask`` (B, T) int host arrays, e.g.
            :class:`minibert.pretraining.PretrainingBatch`; at least one real token in all.
    Returns:
        :class:`ActivationImportance`.
    Raises:
        ValueError: no batch, no real token, or inputs ``BertModel.forward`` refuses.
    """
    config = bert.config
    L, H, C = config.num_hidden_layers, config.num_attention_heads, config.hidden_size
    xp = get_array_module(bert.embeddings.word_embeddings.weight.data)
    hidden, heads = np.zeros(C), np.zeros((L, H))
    neurons, turn = np.zeros((L, config.intermediate_size)), np.zeros(L)
    tokens = 0
    was_training = bert.training
    bert.eval()
    try:
        for b in batches:
            ids, types, mask = (xp.asarray(a) for a in (b.input_ids, b.token_type_ids,
                                                         b.attention_mask))
            out = bert(ids, types, mask, output_hidden_states=True)
            real = mask.astype(bool)                                     # (B, T)
            states = out.hidden_states                                   # L + 1 of (B, T, C)
            mask_add = extended_attention_mask(mask, states[0].dtype)    # (B, 1, 1, T)
            for i, layer in enumerate(bert.encoder.layer):
                x, y = states[i], states[i + 1]                          # (B, T, C) each
                read, ctx, normed, act = (a[real] for a in layer_activations(layer, x,
                                                                             mask_add))
                hidden += to_numpy(xp.abs(read).sum(0) + xp.abs(normed).sum(0))
                heads[i] += to_numpy(xp.linalg.norm(ctx.reshape(len(ctx), H, C // H),
                                                    axis=-1).sum(0))    # ctx: (N, C)
                neurons[i] += to_numpy(xp.abs(act).sum(0))               # act: (N, I)
                before, after = x[real], y[real]                         # (N, C) each
                cos = (before * after).sum(-1) / xp.maximum(
                    xp.linalg.norm(before, axis=-1) * xp.linalg.norm(after, axis=-1), 1e-12)
                turn[i] += float((1.0 - cos).sum())
            hidden += to_numpy(xp.abs(out.last_hidden_state[real]).sum(0))
            tokens += int(real.sum())
            bert.release_caches()
    finally:
        bert.release_caches()
        bert.train(was_training)
    if tokens == 0:
        raise ValueError("activation_importance needs at least one batch with a real token")
    return ActivationImportance(hidden / tokens, heads / tokens, neurons / tokens,
                                turn / tokens)


def layer_activations(layer: BertLayer, x, mask_add):
    """What ``layer`` computes inside from its input ``x``, recomputed forward only by its
    sub-modules as ``BertLayer.forward`` calls them (run it in eval mode for the
    inference values):

        read = attention's LayerNorm(x) if pre-LN else x               (B, T, C)
        ctx = attention.self(read)    the heads' context, before the output projection
        a = attention.output(ctx, x)  the attention sub-layer's output  (B, T, C)
        normed = feed-forward's LayerNorm(a) if pre-LN else a           (B, T, C)
        act = intermediate(normed)    the feed-forward activations      (B, T, I)

    Args:
        layer: a :class:`~minibert.modeling.BertLayer`.
        x: (B, T, C) its input, e.g. ``hidden_states[i]`` of ``BertModel.forward``.
        mask_add: (B, 1, 1, T) additive attention mask
            (:func:`minibert.nn.extended_attention_mask`).
    Returns:
        (read, ctx, normed, act): the inputs of the query/key/value projections, of the
        attention output projection, of the feed-forward up projection and of its down
        projection. The sub-modules keep caches as after a forward
        (:meth:`~minibert.nn.Module.release_caches` drops them).
    """
    pre_ln = hasattr(layer, "ln")  # pre-LN: attention.ln and ln (Megatron-BERT's names)
    read = layer.attention.ln(x) if pre_ln else x                        # (B, T, C)
    ctx = layer.attention.self(read, mask_add)                           # (B, T, C)
    a = layer.attention.output(ctx, x)                                   # (B, T, C)
    normed = layer.ln(a) if pre_ln else a                                # (B, T, C)
    return read, ctx, normed, layer.intermediate(normed)                 # ..., (B, T, I)


def top_indices(scores, k: int) -> np.ndarray:
    """The indices of the ``k`` largest ``scores`` (1-D), in increasing index order; ties
    go to the lower index. Raises ValueError for k outside [1, len(scores)]."""
    scores = np.asarray(scores)
    if not 1 <= k <= len(scores):
        raise ValueError(f"cannot keep {k} of {len(scores)} units")
    return np.sort(np.argsort(-scores, kind="stable")[:k])


def pruned_config(teacher: BertConfig, **fields) -> BertConfig:
    """The teacher's config with the student's sizes (``num_hidden_layers``,
    ``hidden_size``, ``num_attention_heads``, ``intermediate_size``) and any other field
    (e.g. dropout) replaced by ``fields``.

    Raises:
        ValueError: a size above the teacher's, or a head size other than the teacher's
            (heads are pruned whole).
    """
    student = dataclasses.replace(teacher, **fields)
    for name in PRUNED_SIZES:
        if getattr(student, name) > getattr(teacher, name):
            raise ValueError(f"pruning cannot grow {name} from the teacher's "
                             f"{getattr(teacher, name)} to {getattr(student, name)}")
    t_head = teacher.hidden_size // teacher.num_attention_heads
    s_head = student.hidden_size // student.num_attention_heads
    if s_head != t_head or student.hidden_size % student.num_attention_heads:
        raise ValueError(f"pruning keeps whole heads of size {t_head}: hidden_size "
                         f"{student.hidden_size} needs num_attention_heads "
                         f"{student.hidden_size / t_head:g} (got "
                         f"{student.num_attention_heads})")
    return student


# how each tensor is sliced, one letter per axis: c hidden channels, r rows of the kept
# heads, n kept neurons, : everything
_LAYER_RULES = {
    r"attention\.self\.(query|key|value)\.weight": "rc",
    r"attention\.self\.(query|key|value)\.bias": "r",
    r"attention\.output\.dense\.weight": "cr",
    r"intermediate\.dense\.weight": "nc",
    r"intermediate\.dense\.bias": "n",
    r"output\.dense\.weight": "cn",
    r"(attention\.output|output)\.(dense\.bias|LayerNorm\.(weight|bias))": "c",
    r"(attention\.)?ln\.(weight|bias)": "c",   # pre-LN's norms before each sub-layer
}
_OTHER_RULES = {
    r"bert\.embeddings\.\w+_embeddings\.weight": ":c",
    r"(bert\.embeddings\.LayerNorm|bert\.encoder\.ln|cls\.predictions\.transform\.LayerNorm)"
    r"\.(weight|bias)": "c",
    r"(bert\.pooler|cls\.predictions\.transform)\.dense\.weight": "cc",
    r"(bert\.pooler|cls\.predictions\.transform)\.dense\.bias": "c",
    r"cls\.predictions\.(decoder\.)?bias|cls\.seq_relationship\.bias": ":",
    r"cls\.predictions\.decoder\.weight|cls\.seq_relationship\.weight": ":c",
}


def _rule(rules: dict, name: str):
    return next((spec for pattern, spec in rules.items() if re.fullmatch(pattern, name)), None)


def pruned_state(state: dict[str, np.ndarray], teacher: BertConfig, student: BertConfig,
                 importance: ActivationImportance
                 ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The teacher's weights cut to ``student``'s sizes, keeping its most important units.

    The Cs channels with the largest ``importance.hidden`` are kept in every tensor that
    has a hidden axis; the L_s layers with the largest block influence are kept and
    renumbered 0, 1, ... in their original order; in each kept layer the H_s heads
    (with their query/key/value rows and output-projection columns) and the I_s neurons
    with the largest scores. The vocab axis is kept whole.

    Args:
        state: the teacher's weights, HF names (``bert.*``, ``cls.*``). Tensors this
            function does not know (no hidden axis rule) are left out.
        teacher, student: configs; ``student`` from :func:`pruned_config`.
        importance: the teacher's :class:`ActivationImportance`.
    Returns:
        (the student's weights: float32 arrays, HF names; the kept hidden channels
        (Cs,) int64, increasing; the kept teacher layers (L_s,) int64, increasing: student
        layer i is teacher layer ``layers[i]``).
    Raises:
        ValueError: importance of another shape than the teacher's config says.
    """
    L, H, C, I = (teacher.num_hidden_layers, teacher.num_attention_heads,
                  teacher.hidden_size, teacher.intermediate_size)
    want = {"hidden": (C,), "heads": (L, H), "neurons": (L, I), "layers": (L,)}
    for name, shape in want.items():
        if np.shape(getattr(importance, name)) != shape:
            raise ValueError(f"importance.{name}: expected shape {shape} for this teacher, "
                             f"got {np.shape(getattr(importance, name))}")
    head = C // H
    channels = top_indices(importance.hidden, student.hidden_size)
    layers = top_indices(importance.layers, student.num_hidden_layers)
    renumber = {int(t): s for s, t in enumerate(layers)}
    index = {}
    for t in renumber:
        kept = top_indices(importance.heads[t], student.num_attention_heads)
        rows = (kept[:, None] * head + np.arange(head)).ravel()
        index[t] = {"c": channels, "r": rows,
                    "n": top_indices(importance.neurons[t], student.intermediate_size)}

    def cut(tensor, spec, axes):
        tensor = np.asarray(tensor)
        for axis, letter in enumerate(spec):
            if letter != ":":
                tensor = np.take(tensor, axes[letter], axis=axis)
        return np.ascontiguousarray(tensor, dtype=np.float32)

    out = {}
    for key, tensor in state.items():
        m = LAYER_KEY.fullmatch(key)
        if m is None:
            spec = _rule(_OTHER_RULES, key)
            if spec is not None:
                out[key] = cut(tensor, spec, {"c": channels})
        elif int(m.group(1)) in renumber and (spec := _rule(_LAYER_RULES, m.group(2))):
            t = int(m.group(1))
            out[f"bert.encoder.layer.{renumber[t]}.{m.group(2)}"] = cut(tensor, spec, index[t])
    return out, channels, layers
