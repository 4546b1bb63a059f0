"""Which input tokens carried a decision, from the model's own backward.

Every gradient here is the one the hand-written backward computes: the embeddings'
``tap`` (:func:`minibert.modeling.tapped_sum`) hands back the gradient of the score
with respect to the sum of the embedding tables, the input of the embeddings' first
LayerNorm, and lets a forward run on a sum given in its place. Nothing else of the
model's forward or backward is repeated here.

* :func:`gradient_x_input` -- per token, sum_c w[t, c] * g[t, c] with g = d score / d x
  the gradient at the summed input embeddings x = w + p + s (word piece + position +
  token type) and w the word-piece embedding, the part of x that says which token stands
  there (Simonyan et al. 2014, "Deep Inside Convolutional Networks", section 3; Shrikumar
  et al. 2017, "Learning Important Features Through Propagating Activation Differences",
  section 2); and the raw gradient norm ||g[t, :]||_2. Why w and not the whole sum: x
  enters LayerNorm, which gives the same output for c * x (c > 0), so the score is
  homogeneous of degree 0 in each row x[t] and sum_c x[t, c] g[t, c] = 0 (Euler's
  theorem; up to LayerNorm's eps). Captum's ``InputXGradient`` on transformers'
  ``inputs_embeds`` (the word-piece embeddings) gives the same numbers.
* :func:`integrated_gradients` -- Sundararajan et al. 2017, "Axiomatic Attribution for
  Deep Networks", equation 3 and section 5 (Riemann sums) with Gauss-Legendre steps as
  Captum's: IG[t] = sum_c (x - x')[t, c] * sum_k w_k g(x' + a_k (x - x'))[t, c], from a
  baseline x' whose word pieces are [PAD] (or [MASK]) with the position and token-type
  embeddings kept, [CLS] and [SEP] kept as themselves (as Captum's BERT tutorial; in
  :func:`explain` a masked LM's [MASK] too, the question being asked), and
  the completeness gap sum_t IG[t] - (f(x) - f(x')) reported beside it (section 3,
  axiom "completeness"). The steps run ``batch_size`` at a time as one batch.
* :func:`attention_rollout` -- Abnar & Zuidema 2020, "Quantifying Attention Flow in
  Transformers", section 3: per layer A = mean over heads + identity for the residual,
  rows renormalised, multiplied bottom up: R_l = A_l R_{l-1}.
* :func:`explain` -- all of it for one text, with word-level sums of word pieces.

The score f is the probability (softmax) of one target: a class of a sequence
classifier, a label of one token of a token classifier, or one vocabulary token at one
position of a masked LM; ``output="logit"`` takes the logit instead.

Shape legend: T = tokens of the one sequence (with [CLS] and [SEP]), C = width of the
embedding sum (hidden size; ALBERT's and ELECTRA's embedding_size E), L = layers,
NH = heads, K = labels, V = vocabulary, n = steps in one batch.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from .backend import get_array_module, to_numpy

METHODS = ("ig", "grad-x-input", "rollout")
STEP_RULES = ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle",
              "riemann_trapezoid")
OUTPUTS = ("probability", "logit")


class AttributionError(ValueError):
    """A model, target or option an attribution cannot take; the message says which."""


# ------------------------------------------------------------------------------ the head
def head_kind(model) -> str:
    """``"sequence"``, ``"token"`` or ``"mlm"``: which score an attribution reads from
    ``model`` (a sequence classifier, a token classifier, a masked LM; BERT, ALBERT,
    DistilBERT and ELECTRA classes alike, all subclasses of BERT's).

    Raises:
        AttributionError: any other model (a bare encoder, question answering, ELECTRA's
            discriminator).
    """
    from .heads import BertForSequenceClassification, BertForTokenClassification
    from .modeling import BertForPreTraining
    for cls, kind in ((BertForSequenceClassification, "sequence"),
                      (BertForTokenClassification, "token"), (BertForPreTraining, "mlm")):
        if isinstance(model, cls):
            return kind
    raise AttributionError(f"{type(model).__name__} has no head to explain: attributions "
                           "need a sequence or token classifier or a masked LM")


def _embeddings(model):
    return model.backbone.embeddings


class _SumTap:
    """The embeddings' tap: records the sum it is given (``seen``), puts ``sums`` in its
    place when set, and keeps the gradient of the sum (``grad``)."""

    def __init__(self):
        self.sums = self.seen = self.grad = None

    def replace(self, x):
        self.seen = x
        return x if self.sums is None else self.sums

    def keep(self, dx):
        self.grad = dx


@contextmanager
def tapped(model):
    """Set a :class:`_SumTap` on ``model``'s embeddings for the block, in eval mode (no
    dropout), with every parameter frozen but the position / token-type tables (so a
    backward computes input gradients only: it adds into no ``grad``, and it reaches the
    embeddings, whose tap takes the gradient before the tables). Mode, tap and ``requires_grad`` flags are
    restored after; the caches of the last forward are dropped."""
    emb = _embeddings(model)
    params = model.parameters()
    flags = [p.requires_grad for p in params]
    was_training = model.training
    tap = _SumTap()
    # a table the tap shuts off (word embeddings may be tied to a masked LM's decoder)
    keep = {id(p) for name, m in emb.named_children()
            if name in ("position_embeddings", "token_type_embeddings")
            for p in m.parameters()}
    for p in params:
        p.requires_grad = id(p) in keep
    emb.tap = tap
    model.eval()
    try:
        yield tap
    finally:
        del emb.tap
        model.train(was_training)
        for p, f in zip(params, flags):
            p.requires_grad = f
        model.release_caches()


@dataclass
class Inputs:
    """One sequence: ``input_ids`` and ``token_type_ids`` (T,) int; ``position`` the token
    whose output is scored (token classifier, masked LM; 0 for a sequence classifier);
    ``target`` the class or vocabulary id scored."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    target: int
    position: int = 0


def _forward(model, kind: str, inputs: Inputs, n: int, attentions: bool = False):
    """Run ``model`` on n copies of the sequence; returns (logits (n, K) or (n, V), the
    model output). The embeddings' tap decides what sum each copy gets."""
    xp = get_array_module(next(iter(model.parameters())).data)
    ids = xp.asarray(np.tile(inputs.input_ids, (n, 1)))                  # (n, T)
    tt = xp.asarray(np.tile(inputs.token_type_ids, (n, 1)))              # (n, T)
    mask = xp.ones_like(ids)
    if kind == "mlm":
        pos = xp.full((n, 1), inputs.position, dtype=ids.dtype)
        out = model(ids, tt, mask, masked_lm_positions=pos, output_attentions=attentions)
        return out.prediction_logits[:, 0], out                          # (n, V)
    out = model(ids, tt, mask, output_attentions=attentions)
    if kind == "token":
        return out.logits[:, inputs.position], out                       # (n, K)
    return out.logits, out                                               # (n, K)


def _score(logits, target: int, output: str):
    """f = softmax(logits)[:, target] (or logits[:, target]) and df/dlogits (n, K)."""
    xp = get_array_module(logits)
    onehot = xp.zeros_like(logits)
    onehot[:, target] = 1
    if output == "logit":
        return logits[:, target], onehot
    z = logits - logits.max(axis=-1, keepdims=True)
    p = xp.exp(z)
    p /= p.sum(axis=-1, keepdims=True)                                   # (n, K)
    # f = p_t  ->  df/dz_j = p_t (1[j = t] - p_j)
    return p[:, target], p[:, target:target + 1] * (onehot - p)


def _backward(model, kind: str, inputs: Inputs, dlogits) -> None:
    """Back-propagate df/dlogits (n, K) through the model (the tap keeps the result)."""
    if kind == "mlm":
        model.backward(d_prediction_logits=dlogits[:, None, :])         # (n, 1, V)
        return
    if kind == "token":
        xp = get_array_module(dlogits)
        n, K = dlogits.shape
        d = xp.zeros((n, len(inputs.input_ids), K), dtype=dlogits.dtype)  # (n, T, K)
        d[:, inputs.position] = dlogits
        dlogits = d
    model.backward(d_logits=dlogits)


def score_and_gradient(model, inputs: Inputs, tap: _SumTap, sums=None,
                       output: str = "probability", backward: bool = True):
    """f and df/dx for each of the (n, T, C) embedding sums ``sums`` (None: the sum of
    the sequence's own embeddings, n = 1), inside :func:`tapped`.

    Returns:
        (f (n,) array, grad (n, T, C) array or None without ``backward``, the sums the
        model ran on (n, T, C)), arrays of the model's device and dtype.
    """
    n = 1 if sums is None else sums.shape[0]
    tap.sums, tap.grad = sums, None
    logits, _ = _forward(model, head_kind(model), inputs, n)
    seen = tap.seen if sums is None else sums
    f, dlogits = _score(logits, inputs.target, output)
    if backward:
        _backward(model, head_kind(model), inputs, dlogits)
    tap.sums = None
    return f, tap.grad, seen


# ---------------------------------------------------------------------------- the methods
@dataclass
class GradientResult:
    """:func:`gradient_x_input`: ``scores`` (T,) float64 sum_c w * g per token, in units
    of f (probability or logit); ``grad_norm`` (T,) float64 ||g[t]||_2; ``value`` f(x)."""

    scores: np.ndarray
    grad_norm: np.ndarray
    value: float


def gradient_x_input(model, inputs: Inputs, output: str = "probability") -> GradientResult:
    """Gradient x input and the gradient norm per token (Simonyan et al. 2014; Shrikumar
    et al. 2017), by one forward and one backward: the gradient g at the summed input
    embeddings times the word-piece embedding w of each token (see the module docstring
    for why w and not the sum, whose product with g vanishes under LayerNorm).

    Args:
        model: a sequence / token classifier or a masked LM (:func:`head_kind`).
        inputs: the sequence and its target (:class:`Inputs`).
        output: ``"probability"`` (softmax of the target) or ``"logit"``.
    Raises:
        AttributionError: a model without such a head, an unknown ``output``.
    """
    _check_output(output)
    with tapped(model) as tap:
        f, g, _ = score_and_gradient(model, inputs, tap, output=output)
        g, f = to_numpy(g[0]).astype(np.float64), float(to_numpy(f)[0])   # (T, C)
    table = _embeddings(model).word_embeddings.weight.data               # (V, C)
    ids = get_array_module(table).asarray(inputs.input_ids)
    w = to_numpy(table[ids]).astype(np.float64)                          # (T, C)
    return GradientResult((w * g).sum(-1), np.sqrt((g * g).sum(-1)), f)


def step_rule(method: str, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(alphas (steps,), weights (steps,)) float64 of the path integral's quadrature on
    [0, 1], as Captum's ``approximation_methods``: ``gausslegendre`` (NumPy's
    ``leggauss`` nodes and weights mapped from [-1, 1]), ``riemann_left`` / ``_right`` /
    ``_middle`` / ``_trapezoid`` (weights 1/steps; Captum's trapezoid halves the two end
    weights of the ``steps`` evenly spaced points 0 .. 1, so its weights sum to
    1 - 1/steps, not 1: kept as Captum has it, so the results compare, and its
    completeness gap is of order 1/steps).

    Raises:
        AttributionError: an unknown method, steps < 1 (< 2 for a Riemann rule).
    """
    if method not in STEP_RULES:
        raise AttributionError(f"unknown step rule {method!r}; one of {', '.join(STEP_RULES)}")
    if steps < (1 if method == "gausslegendre" else 2):
        raise AttributionError(f"{method} needs at least "
                               f"{1 if method == 'gausslegendre' else 2} steps, got {steps}")
    if method == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(steps)
        return 0.5 * (1 + nodes), 0.5 * weights
    w = np.full(steps, 1.0 / steps)
    alphas = {"riemann_left": np.linspace(0, 1 - 1 / steps, steps),
              "riemann_right": np.linspace(1 / steps, 1, steps),
              "riemann_middle": np.linspace(1 / (2 * steps), 1 - 1 / (2 * steps), steps),
              "riemann_trapezoid": np.linspace(0, 1, steps)}[method]
    if method == "riemann_trapezoid":
        w[0] /= 2
        w[-1] /= 2
    return alphas, w


@dataclass
class IGResult:
    """:func:`integrated_gradients`: ``scores`` (T,) float64 attributions (units of f);
    ``value`` f(x) and ``baseline_value`` f(x'); ``gap`` = sum(scores) - (f(x) - f(x')),
    the completeness gap (0 for the exact integral); ``steps`` and ``method`` used."""

    scores: np.ndarray
    value: float
    baseline_value: float
    gap: float
    steps: int
    method: str


def baseline_ids(input_ids: np.ndarray, baseline_id: int, keep_ids) -> np.ndarray:
    """(T,) int: ``input_ids`` with every id not in ``keep_ids`` (the special tokens:
    [CLS], [SEP]) replaced by ``baseline_id`` ([PAD] or [MASK])."""
    ids = np.asarray(input_ids)
    return np.where(np.isin(ids, list(keep_ids)), ids, baseline_id)


def integrated_gradients(model, inputs: Inputs, baseline: np.ndarray, *, steps: int = 64,
                         method: str = "gausslegendre", batch_size: int = 16,
                         output: str = "probability") -> IGResult:
    """Integrated gradients on the summed input embeddings (Sundararajan et al. 2017,
    eq. 3), with the completeness gap.

    Args:
        model: a sequence / token classifier or a masked LM (:func:`head_kind`).
        inputs: the sequence and its target (:class:`Inputs`).
        baseline: (T,) int ids of the baseline sequence (:func:`baseline_ids`); its sum of
            embeddings (same positions and token types) is x'.
        steps: points of the path integral (>= 1; Riemann rules >= 2).
        method: the quadrature (:data:`STEP_RULES`, :func:`step_rule`).
        batch_size: path points per forward / backward (>= 1).
        output: ``"probability"`` or ``"logit"``.
    Raises:
        AttributionError: a model without such a head, a baseline not (T,), a bad option.
    """
    _check_output(output)
    if int(batch_size) < 1:
        raise AttributionError(f"batch_size must be >= 1, got {batch_size}")
    alphas, weights = step_rule(method, int(steps))
    if np.shape(baseline) != np.shape(inputs.input_ids):
        raise AttributionError(f"baseline: expected shape {np.shape(inputs.input_ids)}, "
                               f"got {np.shape(baseline)}")
    base = Inputs(np.asarray(baseline), inputs.token_type_ids, inputs.target, inputs.position)
    with tapped(model) as tap:
        fx, _, x = score_and_gradient(model, inputs, tap, output=output, backward=False)
        fb, _, xb = score_and_gradient(model, base, tap, output=output, backward=False)
        xp = get_array_module(x)
        diff = x - xb                                                    # (1, T, C)
        total = xp.zeros(x.shape[1:], dtype=np.float64)                  # (T, C)
        for i in range(0, len(alphas), int(batch_size)):
            a = xp.asarray(alphas[i:i + int(batch_size)], dtype=x.dtype)[:, None, None]
            sums = xb + a * diff                                         # (n, T, C)
            _, g, _ = score_and_gradient(model, inputs, tap, sums, output)
            w = xp.asarray(weights[i:i + int(batch_size)])[:, None, None]
            total += (w * g.astype(np.float64)).sum(0)                   # (T, C)
        scores = to_numpy((diff[0].astype(np.float64) * total).sum(-1))  # (T,)
        fx, fb = float(to_numpy(fx)[0]), float(to_numpy(fb)[0])
    return IGResult(scores, fx, fb, float(scores.sum() - (fx - fb)), int(steps), method)


def attention_maps(model, inputs: Inputs) -> np.ndarray:
    """The attention probabilities of every layer and head for the sequence,
    (L, NH, T, T) float64, rows = query token, columns = key token (transformers'
    ``output_attentions``; ALBERT's shared layers give one map per depth)."""
    return _probe(model, inputs)[1]


def _probe(model, inputs: Inputs) -> tuple[np.ndarray, np.ndarray]:
    """One forward: (probabilities (K,) or (V,) at the scored output, attentions
    (L, NH, T, T)), float64."""
    kind = head_kind(model)
    with tapped(model):
        logits, out = _forward(model, kind, inputs, 1, attentions=True)
        probs = to_numpy(_softmax(logits))[0].astype(np.float64)
        return probs, np.stack([to_numpy(a[0]).astype(np.float64) for a in out.attentions])


def attention_rollout(attentions: np.ndarray) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020, section 3; their code's
    ``compute_joint_attention`` with ``add_residual``).

    Args:
        attentions: (L, NH, T, T) float probabilities, layers bottom up.
    Returns:
        (L, T, T) float64: R_l = A_l R_{l-1}, R_0 = A_0, with A_l the mean over heads of
        layer l plus the identity, rows renormalised to sum to 1. Row t of R_l is how
        much the input tokens flow into token t's state after layer l.
    """
    att = np.asarray(attentions, dtype=np.float64)
    L, _, T, _ = att.shape
    a = att.mean(axis=1) + np.eye(T)                                     # (L, T, T)
    a /= a.sum(axis=-1, keepdims=True)
    out = np.empty_like(a)
    out[0] = a[0]
    for layer in range(1, L):
        out[layer] = a[layer] @ out[layer - 1]                           # (T, T)
    return out


def word_sums(scores: np.ndarray, word_ids) -> np.ndarray:
    """(W,) float64: the sum of ``scores`` (T,) over the word pieces of each word;
    ``word_ids`` (T,) gives each piece's word index in [0, W), or None for a piece of
    no word ([CLS], [SEP]), which is left out."""
    W = 1 + max((w for w in word_ids if w is not None), default=-1)
    out = np.zeros(W)
    for s, w in zip(np.asarray(scores, dtype=np.float64), word_ids):
        if w is not None:
            out[w] += s
    return out


def _check_output(output: str) -> None:
    if output not in OUTPUTS:
        raise AttributionError(f"unknown output {output!r}; one of {', '.join(OUTPUTS)}")


# ------------------------------------------------------------------------ one explanation
@dataclass
class Explanation:
    """What :func:`explain` returns for one text.

    Attributes:
        text: the input. method: ``"ig"``, ``"grad-x-input"`` or ``"rollout"``.
        tokens: the T word pieces, [CLS] and [SEP] included.
        scores: (T,) float64 attribution per piece, in units of the score (probability or
            logit; for ``rollout`` the share of the scored token's state, rows sum to 1).
        grad_norm: (T,) float64 ||d f / d x[t]||_2 at the input.
        words: the W words (text spans); word_ids: (T,) each piece's word, None for
            specials; word_scores: (W,) float64 sums of ``scores`` over each word's pieces.
        attentions: (L, NH, T, T) float64; rollout: (L, T, T) float64.
        target: the scored class / token id; target_label: its name; position: the scored
            token; probability: softmax probability of the target at the input;
            predicted / predicted_probability: the arg-max and its probability.
        value, baseline_value, gap: f(x), f(x') and the completeness gap (IG only; None
            for the other methods). steps: IG's path points (None otherwise).
    """

    text: str
    method: str
    tokens: list
    scores: np.ndarray
    grad_norm: np.ndarray
    words: list
    word_ids: list
    word_scores: np.ndarray
    attentions: np.ndarray
    rollout: np.ndarray
    target: int
    target_label: str
    position: int
    probability: float
    predicted: str
    predicted_probability: float
    value: float | None = None
    baseline_value: float | None = None
    gap: float | None = None
    steps: int | None = None
    kind: str = "sequence"
    labels: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain JSON-ready values (arrays as nested lists)."""
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v)
                for k, v in vars(self).items()}


def encode_text(tokenizer, text: str, max_length: int) -> tuple:
    """``[CLS] text [SEP]`` for one text, truncated to ``max_length`` tokens (>= 3).

    Returns:
        (input_ids (T,) int64, tokens [T str], word_ids [T, None for the specials],
        words [W str, the original text of each word's span]).
    Raises:
        AttributionError: an empty (or all-whitespace, all-control) text.
    """
    aligned = tokenizer.text_to_ids_with_offsets(text)
    if not aligned.ids:
        raise AttributionError("the text is empty: nothing to explain")
    keep = max(int(max_length) - 2, 1)
    ids = [tokenizer.cls_token_id, *aligned.ids[:keep], tokenizer.sep_token_id]
    word_ids = [None, *aligned.word_ids[:keep], None]
    spans: dict[int, list] = {}
    for (a, b), w in zip(aligned.offsets[:keep], aligned.word_ids[:keep]):
        lo, hi = spans.get(w, (a, b))
        spans[w] = [min(lo, a), max(hi, b)]
    words = [text[a:b] for _, (a, b) in sorted(spans.items())]
    first = min(spans)                                  # renumber from 0 after truncation
    word_ids = [None if w is None else w - first for w in word_ids]
    return (np.asarray(ids, dtype=np.int64), tokenizer.convert_ids_to_tokens(ids),
            word_ids, words)


def _resolve_target(kind: str, target, labels: list, tokenizer, probs: np.ndarray) -> int:
    """The scored id: None = the arg-max of ``probs``; an int id; a label name
    (classifiers) or a vocabulary token (masked LM). Raises AttributionError otherwise."""
    if target is None:
        return int(np.argmax(probs))
    if kind == "mlm":
        vocab = tokenizer.get_vocab()
        if isinstance(target, str) and target in vocab:
            return int(vocab[target])
        raise AttributionError(f"unknown target token {target!r}: not in the vocabulary")
    if isinstance(target, str) and target in labels:
        return labels.index(target)
    if isinstance(target, (int, np.integer)) and 0 <= int(target) < len(labels):
        return int(target)
    raise AttributionError(f"unknown label {target!r}; the model's labels are "
                           f"{', '.join(map(str, labels))}")


def _position(kind: str, ids: np.ndarray, position, tokenizer) -> int:
    """The scored token: 0 ([CLS]) for a sequence classifier, the first [MASK] for a
    masked LM, ``position`` (default 1, the first piece) for a token classifier."""
    if kind == "sequence":
        return 0
    if position is None and kind == "mlm":
        where = np.flatnonzero(ids == tokenizer.mask_token_id)
        if not len(where):
            raise AttributionError(f"a masked LM explains one {tokenizer.mask_token} "
                                   "prediction: the text has none")
        return int(where[0])
    position = 1 if position is None else int(position)
    if not 0 < position < len(ids) - 1:
        raise AttributionError(f"position must be a word piece in [1, {len(ids) - 2}], "
                               f"got {position}")
    return position


def explain(model, tokenizer, text: str, *, method: str = "ig", target=None,
            labels=None, position: int | None = None, steps: int = 64,
            step_rule_name: str = "gausslegendre", baseline: str = "pad",
            batch_size: int = 16, max_length: int | None = None,
            output: str = "probability") -> Explanation:
    """Attributions, attention and rollout for one text (see the module docstring).

    Args:
        model: a sequence / token classifier or a masked LM (any of the four families).
        tokenizer: its :class:`~minibert.tokenization.BertTokenizer`.
        text: the input text (a masked LM's has a [MASK]).
        method: ``"ig"``, ``"grad-x-input"`` or ``"rollout"`` (:data:`METHODS`).
        target: the label (name or index) or, for a masked LM, the vocabulary token to
            explain; None: the model's prediction.
        labels: the class names (default ``LABEL_0`` ...).
        position: the token of a token classifier to explain (word-piece index, default 1).
        steps, step_rule_name, batch_size: integrated gradients' path points, quadrature
            (:data:`STEP_RULES`) and points per batch.
        baseline: ``"pad"`` or ``"mask"``: the token of IG's baseline.
        max_length: tokens kept, [CLS] and [SEP] included (default: the model's maximum).
        output: score the ``"probability"`` of the target or its ``"logit"``.
    Returns:
        :class:`Explanation`.
    Raises:
        AttributionError: an empty text, an unknown label or token, a masked LM text
            without [MASK], a model without a head to explain, a bad option.
    """
    kind = head_kind(model)
    if method not in METHODS:
        raise AttributionError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    if baseline not in ("pad", "mask"):
        raise AttributionError(f"baseline must be pad or mask, got {baseline!r}")
    cap = model.config.max_position_embeddings
    ids, tokens, word_ids, words = encode_text(tokenizer, text, min(max_length or cap, cap))
    pos = _position(kind, ids, position, tokenizer)
    n = getattr(model, "num_labels", 0)
    labels = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(n)]
    probs, attentions = _probe(model, Inputs(ids, np.zeros_like(ids), 0, pos))
    t = _resolve_target(kind, target, labels, tokenizer, probs)
    inputs = Inputs(ids, np.zeros_like(ids), t, pos)
    grad = gradient_x_input(model, inputs, output)
    rollout = attention_rollout(attentions)
    ig = None
    if method == "ig":
        base_id = tokenizer.pad_token_id if baseline == "pad" else tokenizer.mask_token_id
        keep = (tokenizer.cls_token_id, tokenizer.sep_token_id)
        if kind == "mlm":                  # the [MASK] asked about stays, as the specials
            keep += (tokenizer.mask_token_id,)
        ig = integrated_gradients(model, inputs, baseline_ids(ids, base_id, keep), steps=steps,
                                  method=step_rule_name, batch_size=batch_size, output=output)
    scores = {"ig": ig.scores if ig else None, "grad-x-input": grad.scores,
              "rollout": rollout[-1, pos]}[method]
    name = (lambda i: tokenizer.convert_ids_to_tokens([i])[0]) if kind == "mlm" else \
        (lambda i: labels[i])
    top = int(np.argmax(probs))
    return Explanation(text, method, tokens, np.asarray(scores, dtype=np.float64),
                       grad.grad_norm, words, word_ids, word_sums(scores, word_ids),
                       attentions, rollout, t, name(t), pos, float(probs[t]), name(top),
                       float(probs[top]), ig.value if ig else None,
                       ig.baseline_value if ig else None, ig.gap if ig else None,
                       ig.steps if ig else None, kind, labels if kind != "mlm" else [])


def _softmax(logits):
    xp = get_array_module(logits)
    z = xp.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)
