"""Ask a trained model things: Hugging Face's ``pipeline(task, model)`` on minibert models.

:func:`pipeline` builds one of five pipelines from any start a job accepts (a minibert
run directory or checkpoint, a Hugging Face BERT directory; :func:`minibert.runs.load_start`)
or from a model object and its tokenizer. Task names, call options and output formats
follow transformers' pipelines:

=======================  =========================================  ==============================
task                     input                                      one result
=======================  =========================================  ==============================
``fill-mask``            text with one or more ``[MASK]``           ``[{"score", "token",
                                                                    "token_str", "sequence"}]``
                                                                    (a list per mask when several)
``feature-extraction``   text                                       (T, C) float32 token states,
                                                                    or (C,) with ``pooling``
``text-classification``  text or ``{"text", "text_pair"}``          ``[{"label", "score"}]``
``token-classification`` text                                       ``[{"entity", "score",
                                                                    "index", "word", "start",
                                                                    "end"}]`` (``entity_group``
                                                                    with aggregation "simple")
``question-answering``   ``{"question", "context"}``                ``{"score", "start", "end",
                                                                    "answer"}``
=======================  =========================================  ==============================

A single input gives a single result, a list of inputs a list of results. Inputs are
tokenized, sorted by length and run ``batch_size`` at a time (little padding); each batch
is read back from the device once, so there is no host synchronisation per text. The
fine-tuned tasks run the code that ``finetune.py`` evaluates its test split with
(:mod:`minibert.finetuning.tasks`), so a pipeline predicts what the job reported.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .backend import get_array_module, to_numpy
from .fast import set_fast_paths
from .finetuning.models import predict_split
from .finetuning.data import EncodedSplit, Example, encode_split, length_batches
from .finetuning.qa import QAExample, postprocess_qa_predictions
from .finetuning.tagging import TaggedSentence, encode_tagging, first_pieces
from .finetuning.tasks import TaskBase, make_task, task_for_model
from .heads import (BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification)
from .modeling import BertForPreTraining, BertModel
from .nn.activations import softmax_forward


class PipelineError(ValueError):
    """An input, option or model a pipeline cannot take; the message says which."""


def _l2_normalize(xp, v, eps: float = 1e-12):
    """Rows of ``v`` (N, C) divided by max(||row||, eps) (torch ``F.normalize``)."""
    return v / xp.maximum(xp.sqrt((v * v).sum(-1, keepdims=True)), eps)


class Pipeline:
    """What the five pipelines share: the model on its device (in eval mode during a call,
    its mode restored after), the tokenizer, batching, and calling on one input or a list.

    Args:
        model: a minibert model (the class the task needs, see :func:`pipeline`).
        tokenizer: its :class:`~minibert.tokenization.BertTokenizer`.
        batch_size: inputs per forward (>= 1).
        max_length: tokens per input, special tokens included (default: the tokenizer's
            ``model_max_length`` when set; cap: the model's ``max_position_embeddings``);
            longer inputs are truncated.
        **defaults: call options (e.g. ``top_k``) used when a call does not give them.
    Raises:
        PipelineError: a batch size below 1, or a model of the wrong class.
    """

    task = ""
    model_classes: tuple[type, ...] = ()
    options: tuple[str, ...] = ()

    def __init__(self, model, tokenizer, *, batch_size: int = 32, max_length: int | None = None,
                 **defaults):
        if not isinstance(model, self.model_classes):
            raise PipelineError(f"{self.task} needs a "
                                f"{' or '.join(c.__name__ for c in self.model_classes)}, "
                                f"got {type(model).__name__}")
        if int(batch_size) < 1:
            raise PipelineError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer = model, tokenizer
        self.batch_size = int(batch_size)
        cap = model.config.max_position_embeddings
        self.max_length = min(int(max_length or getattr(tokenizer, "model_max_length", None)
                                  or cap), cap)
        self.defaults = self._check_options(defaults)
        self.xp = get_array_module(next(iter(model.parameters())).data)

    def _check_options(self, options: dict) -> dict:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise PipelineError(f"{self.task}: unknown option(s) {', '.join(unknown)}; it "
                                f"takes {', '.join(self.options) or 'none'}")
        return options

    @staticmethod
    def _single(inputs) -> bool:
        return isinstance(inputs, (str, dict))

    def __call__(self, inputs, **options):
        """Results for ``inputs`` (one input, or a list of them), with call ``options``
        over the pipeline's defaults. Raises PipelineError for an input or option the
        task cannot take (the message gives the input's position from 1)."""
        opts = {**self.defaults, **self._check_options(options)}
        single = self._single(inputs)
        items = [inputs] if single else list(inputs)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self._run(items, **opts) if items else []
        finally:
            self.model.train(was_training)
        return out[0] if single else out

    def _run(self, items: list, **options) -> list:
        raise NotImplementedError

    def explain(self, text: str, **options):
        """Why the model predicts what it does for one ``text``: the
        :class:`~minibert.attribution.Explanation` of
        :func:`minibert.attribution.explain` (attributions per word piece and word,
        attention, rollout) with this pipeline's model, tokenizer, labels and
        ``max_length``; ``options``: that function's (``method``, ``target``,
        ``position``, ``steps`` ...). Text and token classification explain a label,
        fill-mask the token predicted at the [MASK].

        Raises:
            AttributionError (a ValueError): an empty text, an unknown label, a pipeline
                whose model has no head to explain (feature extraction, QA), a bad option.
        """
        from .attribution import AttributionError, explain
        if not isinstance(text, str):
            raise AttributionError(f"explain takes one text, got {type(text).__name__}")
        return explain(self.model, self.tokenizer, text, labels=getattr(self, "labels", None),
                       max_length=self.max_length, **options)

    def _encode(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None
                ) -> EncodedSplit:
        """``[CLS] text [SEP]`` (``[CLS] text [SEP] pair [SEP]``) ids, truncated to
        :attr:`max_length`."""
        pairs = pairs or [None] * len(texts)
        return encode_split(self.tokenizer, [Example(t, p, "", n + 1, "input")
                                             for n, (t, p) in enumerate(zip(texts, pairs))],
                            self.max_length)

    @staticmethod
    def _texts(items: list) -> list[str]:
        for n, t in enumerate(items, 1):
            if not isinstance(t, str):
                raise PipelineError(f"input {n}: expected a text, got {type(t).__name__}")
        return items


# ------------------------------------------------------------------------------- fill-mask
class FillMaskPipeline(Pipeline):
    """The ``top_k`` most probable tokens at each ``[MASK]`` (transformers'
    ``FillMaskPipeline``): per mask, ``{"score": probability, "token": id, "token_str":
    the token, "sequence": the text with that token in the mask's place}``. With several
    masks, one list per mask, each filled alone (the other masks stay ``[MASK]`` and, as
    in transformers, the sequence keeps ``[CLS]`` / ``[SEP]``). ``targets``: score only
    these words (each word's first WordPiece).

    Options: ``top_k`` (default 5, >= 1), ``targets`` (a word or a list of words).
    Raises (on call): PipelineError for a text without ``[MASK]`` (within ``max_length``).
    """

    task = "fill-mask"
    model_classes = (BertForPreTraining,)
    options = ("top_k", "targets")

    def _run(self, items, top_k: int = 5, targets=None) -> list:
        if int(top_k) < 1:
            raise PipelineError(f"top_k must be >= 1, got {top_k}")
        split = self._encode(self._texts(items))
        mask_id = self.tokenizer.mask_token_id
        for n, ids in enumerate(split.input_ids, 1):
            if mask_id not in ids:
                raise PipelineError(f"input {n}: no {self.tokenizer.mask_token} in "
                                    f"{items[n - 1][:60]!r}" + (
                                        f" within its first {self.max_length} tokens"
                                        if self.tokenizer.mask_token in items[n - 1] else ""))
        return self.fill_ids(split.input_ids, int(top_k), self._target_ids(targets))

    def _target_ids(self, targets) -> list[int] | None:
        if targets is None:
            return None
        words = [targets] if isinstance(targets, str) else list(targets)
        ids = []
        for w in words:
            pieces = self.tokenizer.tokenize(w)
            if not pieces:
                raise PipelineError(f"target {w!r} gives no token")
            ids.append(self.tokenizer.convert_tokens_to_ids(pieces[0]))
        return ids

    def fill_ids(self, rows: Sequence[Sequence[int]], top_k: int = 5,
                 target_ids: Sequence[int] | None = None) -> list:
        """:meth:`__call__`'s results for token id rows (``[CLS] ... [SEP]``, each with at
        least one ``mask_token_id``), one list per row: the pretraining job's samples
        call this on held-out sentences."""
        xp, mask_id = self.xp, self.tokenizer.mask_token_id
        split = EncodedSplit([list(r) for r in rows], [[0] * len(r) for r in rows], None)
        positions = [[t for t, i in enumerate(r) if i == mask_id] for r in split.input_ids]
        targets = None if target_ids is None else xp.asarray(np.asarray(target_ids))
        results: list = [None] * len(rows)
        for b in length_batches(split, self.batch_size, self.tokenizer.pad_token_id):
            P = max(len(positions[i]) for i in b.index)
            pos = np.zeros((len(b.index), P), dtype=np.int64)
            for r, i in enumerate(b.index):
                pos[r, :len(positions[i])] = positions[i]
            d = b.to(xp)
            logits = self.model(d.input_ids, d.token_type_ids, d.attention_mask,
                                masked_lm_positions=xp.asarray(pos)).prediction_logits
            scores, ids = self._top(logits, top_k, targets)          # (B, P, k) each
            scores, ids = to_numpy(scores), to_numpy(ids)            # one read per batch
            for r, i in enumerate(b.index):
                results[i] = self._format(split.input_ids[i], positions[i], scores[r], ids[r])
        return results

    def _top(self, logits, k: int, targets):
        """Probabilities (softmax over the vocabulary, float32) and ids of the k best, best
        first: (B, P, k) each."""
        xp = self.xp
        probs = softmax_forward(logits.astype(xp.float32))[0]        # (B, P, V)
        if targets is not None:
            probs = probs[..., targets]
        k = min(k, probs.shape[-1])
        top = (xp.argpartition(-probs, k - 1, axis=-1)[..., :k] if k < probs.shape[-1]
               else xp.broadcast_to(xp.arange(k), probs.shape))
        vals = xp.take_along_axis(probs, top, -1)
        order = xp.argsort(-vals, axis=-1)
        top, vals = xp.take_along_axis(top, order, -1), xp.take_along_axis(vals, order, -1)
        return vals, (targets[top] if targets is not None else top)

    def _format(self, ids, positions, scores, top) -> list:
        single = len(positions) == 1
        decode = self.tokenizer.decode
        out = []
        for j, t in enumerate(positions):
            row = []
            for v, p in zip(scores[j], top[j]):
                filled = list(ids)
                filled[t] = int(p)
                row.append({"score": float(v), "token": int(p), "token_str": decode([int(p)]),
                            "sequence": decode(filled, skip_special_tokens=single)})
            out.append(row)
        return out[0] if single else out


# ---------------------------------------------------------------------- feature-extraction
class FeatureExtractionPipeline(Pipeline):
    """The encoder's last hidden states of each text: a (T, C) float32 array (T its tokens,
    ``[CLS]`` and ``[SEP]`` included). With ``pooling="mean"`` the mean over the tokens,
    with ``pooling="cls"`` the ``[CLS]`` row: a (C,) sentence embedding; ``normalize``
    divides it by its L2 norm. Mean pooling with normalisation is sentence-transformers'
    all-MiniLM-L6-v2 recipe (``Pooling(mode="mean")`` + ``Normalize``), so cosine
    similarity is then a dot product.

    transformers' ``FeatureExtractionPipeline`` returns nested lists with a leading batch
    axis of 1; this returns arrays.

    Options: ``pooling`` (None, ``"mean"``, ``"cls"``), ``normalize`` (needs pooling).
    """

    task = "feature-extraction"
    model_classes = (BertModel,)
    options = ("pooling", "normalize")

    def _run(self, items, pooling: str | None = None, normalize: bool = False) -> list:
        if pooling not in (None, "mean", "cls"):
            raise PipelineError(f"pooling must be 'mean', 'cls' or None, got {pooling!r}")
        if normalize and pooling is None:
            raise PipelineError("normalize needs pooling ('mean' or 'cls')")
        xp = self.xp
        split = self._encode(self._texts(items))
        results: list = [None] * len(split)
        for b in length_batches(split, self.batch_size, self.tokenizer.pad_token_id):
            d = b.to(xp)
            h = self.model(d.input_ids, d.token_type_ids, d.attention_mask).last_hidden_state
            if pooling == "mean":
                m = d.attention_mask[..., None].astype(h.dtype)      # (B, T, 1)
                h = (h * m).sum(1) / m.sum(1)                        # (B, C)
            elif pooling == "cls":
                h = h[:, 0]
            if normalize:
                h = _l2_normalize(xp, h)
            h = to_numpy(h)                                          # one read per batch
            for r, i in enumerate(b.index):
                results[i] = h[r] if pooling else h[r, :len(split.input_ids[i])]
        return results


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """cos(a, b) = a.b / (|a| |b|) of two (C,) vectors (0 when either is zero)."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(np.dot(a, b)) / (na * nb) if na and nb else 0.0


# --------------------------------------------------------------------- fine-tuned tasks
class _FinetunedPipeline(Pipeline):
    """A pipeline over a fine-tuned model: its :class:`~minibert.finetuning.tasks.TaskBase`
    (``task_obj``, the settings it was trained with, whose ``max_seq_length`` is the
    default ``max_length``; when they hold none, e.g. a transformers directory, the task's
    default length bounded by the tokenizer's ``model_max_length``) and label set (``labels``; default ``LABEL_0`` ... as
    transformers)."""

    finetune_task = ""

    def __init__(self, model, tokenizer, *, labels: Sequence[str] | None = None,
                 task_obj: TaskBase | None = None, max_length: int | None = None, **kwargs):
        n = getattr(model, "num_labels", 0)
        self.labels = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(n)]
        if n and len(self.labels) != n:
            raise PipelineError(f"{len(self.labels)} labels for a model with {n} outputs")
        self.task_obj = task_obj or make_task(self.finetune_task, None, None, self.labels)
        default = self.task_obj.max_len(model.config)
        trained = self.task_obj.option("max_seq_length", None) is not None   # recorded
        if not trained and getattr(tokenizer, "model_max_length", None):
            default = min(default, tokenizer.model_max_length)
        super().__init__(model, tokenizer, max_length=max_length or default, **kwargs)


class TextClassificationPipeline(_FinetunedPipeline):
    """Class probabilities of a text or text pair (``{"text": a, "text_pair": b}``):
    ``[{"label", "score"}]``, the ``top_k`` most probable (default 1; None: every label),
    best first (transformers' ``TextClassificationPipeline``; as there, a list of inputs
    with ``top_k=1`` gives one dict per input)."""

    task = "text-classification"
    finetune_task = "sequence-classification"
    model_classes = (BertForSequenceClassification,)
    options = ("top_k",)

    def __call__(self, inputs, **options):
        out = super().__call__(inputs, **options)
        if not self._single(inputs) and {**self.defaults, **options}.get("top_k", 1) == 1:
            return [r[0] for r in out]
        return out

    def _run(self, items, top_k: int | None = 1) -> list:
        if top_k is not None and int(top_k) < 1:
            raise PipelineError(f"top_k must be >= 1 or None, got {top_k}")
        texts, pairs = [], []
        for n, x in enumerate(items, 1):
            if isinstance(x, dict) and isinstance(x.get("text"), str):
                texts.append(x["text"])
                pairs.append(x.get("text_pair"))
            elif isinstance(x, str):
                texts.append(x)
                pairs.append(None)
            else:
                raise PipelineError(f"input {n}: expected a text or {{'text', 'text_pair'}}")
        probs = predict_split(self.model, self._encode(texts, pairs), self.batch_size,
                              self.tokenizer.pad_token_id, self.xp)     # (N, K)
        k = len(self.labels) if top_k is None else min(int(top_k), len(self.labels))
        return [[{"label": self.labels[j], "score": float(p[j])}
                 for j in np.argsort(-p, kind="stable")[:k]] for p in probs]


class TokenClassificationPipeline(_FinetunedPipeline):
    """A tag per word (transformers' ``TokenClassificationPipeline``, at word level: a
    word's tag and score are those of its first piece, as the fine-tuning job reads
    them). Words are whitespace-separated, or characters for a character-level tagger.
    Words tagged ``O`` are left out, as transformers' ``ignore_labels``.

    ``aggregation_strategy="none"`` (default): per word ``{"entity", "score", "index"
    (the word's first piece in the input ids), "word", "start", "end"}`` (character
    offsets in the text). ``"simple"``: consecutive words of one entity merged as
    transformers does (a ``B-`` tag starts a new entity, an ``I-`` tag or a tag without
    prefix continues one of the same type): ``{"entity_group", "score" (mean), "word"
    (the text span), "start", "end"}``.
    """

    task = "token-classification"
    finetune_task = "token-classification"
    model_classes = (BertForTokenClassification,)
    options = ("aggregation_strategy",)

    def _run(self, items, aggregation_strategy: str = "none") -> list:
        if aggregation_strategy not in ("none", "simple"):
            raise PipelineError("aggregation_strategy must be 'none' or 'simple', got "
                                f"{aggregation_strategy!r}")
        spans = [self.task_obj.word_spans(t) for t in self._texts(items)]
        texts = [n for n, s in enumerate(spans) if s]          # the inputs with words
        sentences = [TaggedSentence([w for w, _, _ in spans[n]], ["O"] * len(spans[n]), 1,
                                    f"input {n + 1}") for n in texts]
        words: list[list[dict]] = [[] for _ in items]
        if sentences:
            split = encode_tagging(self.tokenizer, sentences, self.max_length, None)
            probs, _ = self.task_obj.row_probabilities(self.model, split, self.batch_size,
                                                       self.xp, self.tokenizer.pad_token_id)
            for n, pieces in zip(texts, first_pieces(split)):
                for (w, a, b), p in zip(spans[n], pieces):
                    j = int(probs[p[0]][p[1]].argmax()) if p else None
                    words[n].append({
                        "entity": self.labels[j] if p else "O",
                        "score": float(probs[p[0]][p[1]][j]) if p else 0.0,
                        "index": p[1] if p else None, "word": items[n][a:b], "start": a,
                        "end": b})
        if aggregation_strategy == "simple":
            return [[g for g in _group_entities(w, t) if g["entity_group"] != "O"]
                    for w, t in zip(words, items)]
        return [[w for w in ws if w["entity"] != "O"] for ws in words]


def _tag_parts(tag: str) -> tuple[str, str]:
    """(``B`` or ``I``, type) as transformers' ``get_tag``: no prefix reads as ``I``."""
    return (tag[0], tag[2:]) if tag[:2] in ("B-", "I-") else ("I", tag)


def _group_entities(words: list[dict], text: str) -> list[dict]:
    """Merge consecutive words into entities (transformers' ``group_entities``)."""
    groups: list[list[dict]] = []
    for w in words:
        bi, tag = _tag_parts(w["entity"])
        if groups and bi != "B" and _tag_parts(groups[-1][-1]["entity"])[1] == tag:
            groups[-1].append(w)
        else:
            groups.append([w])
    return [{"entity_group": _tag_parts(g[0]["entity"])[1],
             "score": float(np.mean([w["score"] for w in g])),
             "word": text[g[0]["start"]:g[-1]["end"]], "start": g[0]["start"],
             "end": g[-1]["end"]} for g in groups]


class QuestionAnsweringPipeline(_FinetunedPipeline):
    """The answer span of a question in a context (transformers'
    ``QuestionAnsweringPipeline``): ``{"score", "start", "end", "answer"}`` with
    ``context[start:end] == answer``. The span is the fine-tuning job's (n-best over
    start + end logits over every window, :func:`~minibert.finetuning.postprocess_qa_predictions`,
    with the run's ``doc_stride`` / ``max_answer_length``); ``score`` is its probability
    in its window, softmax(start logits)[start] x softmax(end logits)[end] over the
    context tokens. No valid span: ``{"score": 0.0, "start": 0, "end": 0, "answer": ""}``.

    Inputs: ``{"question": q, "context": c}``, or ``question=`` and ``context=`` keywords.
    """

    task = "question-answering"
    finetune_task = "question-answering"
    model_classes = (BertForQuestionAnswering,)

    def __call__(self, inputs=None, *, question=None, context=None, **options):
        if inputs is None:
            if question is None or context is None:
                raise PipelineError("question-answering needs question= and context=")
            inputs = ({"question": question, "context": context} if isinstance(question, str)
                      else [{"question": q, "context": c} for q, c in zip(question, context)])
        return super().__call__(inputs, **options)

    def _run(self, items) -> list:
        examples = []
        for n, x in enumerate(items, 1):
            if not (isinstance(x, dict) and isinstance(x.get("question"), str)
                    and isinstance(x.get("context"), str)):
                raise PipelineError(f"input {n}: expected {{'question': ..., 'context': ...}}")
            if not x["question"].strip() or not x["context"].strip():
                raise PipelineError(f"input {n}: empty question or context")
            examples.append(QAExample(str(n), "", x["context"], x["question"], [], [], n, "input"))
        t = self.task_obj
        feats = t.features(self.tokenizer, examples, self.max_length)
        starts, ends, _ = t.logits(self.model, feats, self.batch_size, self.xp,
                                   self.tokenizer.pad_token_id)
        preds = postprocess_qa_predictions(feats, starts, ends, int(t.option("n_best_size", 20)),
                                           int(t.option("max_answer_length", 30)))
        return [_qa_result(preds[ex.id], feats, starts, ends) for ex in examples]


def _qa_result(p, feats, starts, ends) -> dict:
    if p.feature < 0:
        return {"score": 0.0, "start": 0, "end": 0, "answer": ""}
    off = feats.offsets[p.feature]
    ctx = off[:, 0] >= 0
    i = int(np.flatnonzero(ctx & (off[:, 0] == p.start))[0])
    j = int(np.flatnonzero(ctx & (off[:, 1] == p.end))[-1])

    def log_prob(logits, k):
        z = logits[ctx]
        return float(logits[k] - (z.max() + np.log(np.exp(z - z.max()).sum())))

    score = math.exp(log_prob(starts[p.feature], i) + log_prob(ends[p.feature], j))
    return {"score": score, "start": p.start, "end": p.end, "answer": p.text}


# ----------------------------------------------------------------------------- building
PIPELINES: dict[str, type[Pipeline]] = {c.task: c for c in (
    FillMaskPipeline, FeatureExtractionPipeline, TextClassificationPipeline,
    TokenClassificationPipeline, QuestionAnsweringPipeline)}


def load_pipeline_model(task: str, path, option: str = "model"):
    """(model, tokenizer, extra pipeline arguments) for ``task`` from the start at ``path``
    (see :func:`minibert.runs.load_start`; or an already loaded
    :class:`~minibert.runs.Pretrained`), on the current device.

    fill-mask needs the masked-LM head (``cls.predictions.*``, ALBERT's
    ``predictions.*``); feature-extraction takes the encoder of any start; the fine-tuned
    tasks need a model fine-tuned on that task. An ALBERT start gives the ALBERT class of
    each (:mod:`minibert.auto`).

    Raises:
        RunError: nothing loadable at ``path``. PipelineError: a start without the head
            the task needs, or fine-tuned on another task.
    """
    from .auto import MLM_HEAD_PREFIXES, has_mlm_head
    from .backend import get_device
    from .runs import Pretrained, RunError, load_start
    from .tokenization import BertTokenizer

    pre = path if isinstance(path, Pretrained) else load_start(path, option)
    if isinstance(path, Pretrained):
        path = pre.source
    extra: dict[str, Any] = {}
    if task == "fill-mask" and not has_mlm_head(pre.state):
        head = MLM_HEAD_PREFIXES[type(pre.config)]        # cls.predictions. (ALBERT: predictions.)
        raise PipelineError(f"{option} {path}: no masked-LM head ({head}*) in "
                            f"{pre.source}; fill-mask needs a pretrained masked LM")
    if task in ("fill-mask", "feature-extraction"):
        from .hf import HFFormatError
        role, kwargs = ((BertForPreTraining, {"seq_relationship_head": False})
                        if task == "fill-mask" else (BertModel, {"add_pooling_layer": False}))
        try:
            model, _ = pre.build(role, **kwargs)
        except HFFormatError as e:
            raise RunError(f"{option} {path}: {e}") from None
    else:
        ft = task_for_model(pre)
        want = PIPELINES[task].finetune_task
        if ft is None or ft.name != want:
            what = f"a {ft.name} model" if ft else "not a fine-tuned model"
            raise PipelineError(f"{option} {path}: {what}; {task} needs a model fine-tuned "
                                f"with finetune.py --task {want}")
        model, _ = ft.model_from_start(pre, pre.labels)
        extra = {"labels": pre.labels, "task_obj": ft}
    tokenizer = BertTokenizer(pre.vocab_file, **pre.tokenizer_options)
    return model.to(get_device()), tokenizer, extra


def explain_task(pre) -> str:
    """The pipeline task that explains the start ``pre`` (a
    :class:`~minibert.runs.Pretrained`): ``text-classification`` or
    ``token-classification`` for a model fine-tuned on those, ``fill-mask`` for a start
    with its masked-LM head.

    Raises:
        PipelineError: a start with none of these heads (question answering, an encoder
            alone), naming what it is.
    """
    from .auto import has_mlm_head
    ft = task_for_model(pre)
    if ft is not None:
        for name in ("text-classification", "token-classification"):
            if PIPELINES[name].finetune_task == ft.name:
                return name
        raise PipelineError(f"{pre.source}: a {ft.name} model; explain needs a sequence or "
                            "token classifier or a masked LM")
    if has_mlm_head(pre.state):
        return "fill-mask"
    raise PipelineError(f"{pre.source}: neither a fine-tuned classifier nor a masked LM "
                        "(no head to explain)")


def pipeline(task: str, model, tokenizer=None, *, batch_size: int = 32,
             max_length: int | None = None, device: str | None = None, fast_cpu: bool = True,
             **options) -> Pipeline:
    """A pipeline for ``task`` (a key of :data:`PIPELINES`), as transformers'
    ``pipeline(task, model)``.

    Args:
        task: ``"fill-mask"``, ``"feature-extraction"``, ``"text-classification"``,
            ``"token-classification"`` or ``"question-answering"``.
        model: a path (a minibert run directory / checkpoint or a Hugging Face BERT
            directory: :func:`load_pipeline_model`), or a model object (``BertForPreTraining``,
            ``BertModel``, or the task's fine-tuning class) given with its ``tokenizer``.
        tokenizer: the model object's tokenizer (from a path: its ``vocab.txt``).
        batch_size, max_length: see :class:`Pipeline`.
        device: ``"cpu"`` or ``"cuda"`` to move the model there; None keeps it where it
            is (a loaded model goes to the current device, :func:`minibert.backend.get_device`).
        fast_cpu: switch the fast paths on (True) or off, for the whole process
            (:func:`minibert.fast.set_fast_paths`; off, the formulas of
            :mod:`minibert.nn` run, as on a plain import).
        **options: the task's call options as defaults, and for a model object of a
            fine-tuned task ``labels=`` (the class names).
    Returns:
        the :class:`Pipeline`; call it on one input or a list.
    Raises:
        PipelineError: an unknown task or option, a model of the wrong kind, a model
            object without its tokenizer. RunError: a path with no loadable model.
    """
    if task not in PIPELINES:
        raise PipelineError(f"unknown task {task!r}; one of {', '.join(PIPELINES)}")
    set_fast_paths(fast_cpu)
    if isinstance(model, (str, Path, os.PathLike)):
        model, tokenizer, extra = load_pipeline_model(task, model)
        options = {**extra, **options}
    elif tokenizer is None:
        raise PipelineError("a model object needs its tokenizer (tokenizer=...)")
    if device is not None:
        model = model.to(device)
    return PIPELINES[task](model, tokenizer, batch_size=batch_size, max_length=max_length,
                           **options)


def for_finetune_task(task: TaskBase, model, tokenizer, labels, **kwargs) -> Pipeline:
    """The pipeline of a fine-tuning task object (``finetune.py --predict``)."""
    name = next(k for k, c in PIPELINES.items()
                if getattr(c, "finetune_task", None) == task.name)
    return PIPELINES[name](model, tokenizer, labels=labels, task_obj=task, **kwargs)


__all__ = ["PIPELINES", "Pipeline", "PipelineError", "FillMaskPipeline",
           "FeatureExtractionPipeline", "TextClassificationPipeline",
           "TokenClassificationPipeline", "QuestionAnsweringPipeline", "cosine_similarity",
           "explain_task", "for_finetune_task", "load_pipeline_model", "pipeline"]
