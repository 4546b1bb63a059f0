"""The models of a fine-tuning run (sequence classifier, tagger, QA), built from a
starting point (:func:`model_from_start`); the sequence classifier's evaluation over a
split (:func:`eval_batches`, :func:`predict_split`, :func:`evaluate`)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..auto import bert_role, model_class as family_class
from ..backend import to_numpy
from ..hf import load_pretrained_weights
from ..heads import BertForQuestionAnswering, BertForSequenceClassification
from ..runs import Pretrained
from .data import EncodedSplit, length_batches
from .metrics import classification_metrics, softmax_np


# the head tensors of the fine-tuning models (everything else is ``bert.*``)
HEAD_PREFIXES = ("classifier.", "qa_outputs.", "pre_classifier.")   # pre_: DistilBERT


def model_from_start(pre: Pretrained, model_class=BertForSequenceClassification,
                labels: Sequence[str] | None = None, seed: int = 0, dtype=np.float32,
                random_init: bool = False, classifier_dropout: float | None = None,
                classifier_pooling: str | None = None):
    """A fine-tuning model (``model_class``: :class:`BertForSequenceClassification`,
    :class:`~minibert.heads.BertForTokenClassification` or
    :class:`~minibert.heads.BertForQuestionAnswering`; the ALBERT class of that role,
    :mod:`minibert.auto`, when ``pre`` is an ALBERT) with ``len(labels)`` classes (2
    start/end outputs for question answering, ``labels`` None), weights from ``pre``, or
    all fresh when ``random_init`` (same architecture and vocab, for baselines).

    The head of ``pre`` is kept only when it is a head of the same role
    (``pre.architecture``) with the same labels and pooling (a fine-tuned model trained
    on); else the head is new. ``classifier_dropout`` / ``classifier_pooling`` (None: the
    start's config) set those config fields (ALBERT's dropout field is
    ``classifier_dropout_prob``, DistilBERT's ``seq_classif_dropout``; a DistilBERT
    classifier reads the first token only, through ``pre_classifier``).

    Returns:
        (model, report) with report as :func:`minibert.hf.load_pretrained_weights`.
    Raises:
        HFFormatError: encoder weights that do not fit the config.
        ValueError: ``labels`` missing for a classifier.
    """
    kw = pre.config.to_dict()
    role, model_class = model_class, family_class(pre.config, model_class)
    if role is BertForQuestionAnswering:
        kw["num_labels"] = 2
    else:
        if not labels:
            raise ValueError(f"{model_class.__name__} needs its label set")
        kw["num_labels"] = len(labels)
    if classifier_dropout is not None:
        # the field's name in each family: BERT's, ALBERT's, DistilBERT's (sequence head)
        kw[next(k for k in ("classifier_dropout", "classifier_dropout_prob",
                            "seq_classif_dropout") if k in kw)] = classifier_dropout
    if classifier_pooling is not None:
        if "classifier_pooling" not in kw and classifier_pooling != "cls":
            raise ValueError(f"classifier_pooling {classifier_pooling!r}: a "
                             f"{pre.config.model_type} start reads the first token only")
        if "classifier_pooling" in kw:
            kw["classifier_pooling"] = classifier_pooling
    model = model_class(type(pre.config)(**kw), seed=seed, dtype=dtype)
    if random_init:
        return model, {"loaded": [], "new": [n for n, _ in model.named_parameters()],
                       "unused": sorted(pre.state)}
    state = dict(pre.state)
    same_head = (bert_role(pre.architecture) in (None, role.__name__)
                 and (pre.labels is None or labels is None or list(pre.labels) == list(labels))
                 and pre.config.classifier_pooling == kw.get("classifier_pooling", "cls"))
    if not same_head:
        state = {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIXES)}
    return model, load_pretrained_weights(model, state, pre.source)


def eval_batches(model, split: EncodedSplit, batch_size: int, pad_id: int = 0, xp=np):
    """(host :class:`~minibert.finetuning.data.FinetuningBatch`, model output) over every row of
    ``split`` in eval mode (no dropout), in batches of rows sorted by length (little
    padding; a row's outputs do not depend on its batch, and ``batch.index`` says which
    rows a batch holds). The model's train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        for b in length_batches(split, batch_size, pad_id):
            d = b.to(xp)
            yield b, model(d.input_ids, d.token_type_ids, d.attention_mask)
    finally:
        model.train(was_training)


def split_logits(model: BertForSequenceClassification, split: EncodedSplit, batch_size: int,
                 pad_id: int = 0, xp=np) -> np.ndarray:
    """Logits (N, K) float32 of every row of ``split`` on the host (:func:`eval_batches`)."""
    logits = np.zeros((len(split), model.num_labels), dtype=np.float32)
    for b, out in eval_batches(model, split, batch_size, pad_id, xp):
        logits[b.index] = to_numpy(out.logits)
    return logits


def predict_split(model: BertForSequenceClassification, split: EncodedSplit, batch_size: int,
                  pad_id: int = 0, xp=np) -> np.ndarray:
    """Class probabilities (N, K) float64 of every row of ``split`` (eval mode, no dropout;
    the softmax of :func:`split_logits`)."""
    return softmax_np(split_logits(model, split, batch_size, pad_id, xp))


def evaluate(model, split: EncodedSplit, batch_size: int, pad_id: int = 0, xp=np
             ) -> tuple[dict[str, float], np.ndarray]:
    """Metrics (:func:`classification_metrics` plus ``loss``, mean cross-entropy in nats)
    and the (N, K) probabilities of a labelled split.

    Raises:
        ValueError: the split has no labels.
    """
    if split.labels is None:
        raise ValueError("evaluate needs a labelled split")
    probs = predict_split(model, split, batch_size, pad_id, xp)
    m = classification_metrics(split.labels, probs.argmax(-1), model.num_labels)
    p_gold = probs[np.arange(len(split)), split.labels]
    m["loss"] = float(-np.log(np.maximum(p_gold, 1e-300)).mean())
    return m, probs


__all__ = ["HEAD_PREFIXES", "model_from_start", "eval_batches", "split_logits", "predict_split",
           "evaluate"]
