"""The teacher of general distillation: a frozen BERT run forward only, in inference mode.

:func:`load_teacher` builds a :class:`Teacher` from a starting point
(:func:`minibert.runs.load_start`: a Hugging Face BERT directory or a minibert run): a
``BertForPreTraining`` when its weights hold the MLM head, else a bare ``BertModel`` (e.g.
a sentence-embedding model), which gives hidden states and attention but no soft targets.
Its outputs are computed on the fly for each batch and its forward caches released right
after (:meth:`minibert.nn.Module.release_caches`), so it holds one batch's activations at
most while it runs and none between batches.

Shape legend: B = batch, T = sequence length, P = masked-LM slots per sequence,
V = vocab size, Ct = the teacher's hidden size, NH = heads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..auto import MLM_HEAD_PREFIXES, has_mlm_head
from ..hf import HFFormatError
from ..modeling import BertConfig, BertForPreTraining, BertModel

__all__ = ["Teacher", "TeacherOutput", "has_mlm_head", "load_teacher"]


@dataclass
class TeacherOutput:
    """What a student learns from, for one batch (device arrays, constants).

    prediction_logits: (B, P, V) MLM logits at the masked positions, or None.
    last_hidden_state: (B, T, Ct).
    last_attention: (B, NH, T, T) last-layer attention probabilities, or None.
    """

    prediction_logits: Any
    last_hidden_state: Any
    last_attention: Any = None


class Teacher:
    """A frozen BERT run forward only, in inference mode (no dropout; caches dropped).

    Not a :class:`~minibert.nn.Module`, so a student that holds one does not count, train
    or save its parameters.

    Args:
        model: a :class:`~minibert.modeling.BertForPreTraining` (with its MLM head) or a
            bare :class:`~minibert.modeling.BertModel` (no head: no soft targets), loaded.
    """

    def __init__(self, model):
        self.model = model.eval()
        self.has_mlm_head = isinstance(model, BertForPreTraining)
        self.config: BertConfig = model.config
        self.bert = model.backbone   # the encoder (bert, albert, distilbert, electra ...)

    def to(self, device: str, dtype=None) -> "Teacher":
        self.model.to(device, dtype)
        return self

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    def __call__(self, input_ids, token_type_ids, attention_mask, masked_lm_positions=None, *,
                 logits: bool = True, attentions: bool = False) -> TeacherOutput:
        """One forward on a batch (inputs as ``BertForPreTraining.forward``).

        Args:
            logits: compute the MLM logits at ``masked_lm_positions`` (needs the head).
            attentions: keep the last layer's attention probabilities.
        Raises:
            ValueError: ``logits`` without an MLM head, or bad inputs.
        """
        if logits and not self.has_mlm_head:
            raise ValueError("the teacher has no MLM head: no soft targets")
        self.model.eval()
        if logits:
            out = self.model(input_ids, token_type_ids, attention_mask,
                             masked_lm_positions=masked_lm_positions,
                             output_attentions=attentions)
            result = TeacherOutput(out.prediction_logits, out.hidden_states)
        else:
            out = self.bert(input_ids, token_type_ids, attention_mask, attentions)
            result = TeacherOutput(None, out.last_hidden_state)
        if attentions:
            result.last_attention = out.attentions[-1]                   # (B, NH, T, T)
        self.model.release_caches()
        return result

    def mlm_loss_sums(self, batches, xp) -> tuple[float, float]:
        """(summed MLM nats, counted positions) of the teacher over ``batches``
        (:class:`minibert.pretraining.PretrainingBatch`): its held-out MLM loss is their ratio."""
        if not self.has_mlm_head:
            raise ValueError("the teacher has no MLM head")
        self.model.eval()
        total = count = 0.0
        for b in batches:
            kw = {k: xp.asarray(v) for k, v in b.model_inputs().items()
                  if k != "next_sentence_label"}
            out = self.model(**kw)
            n = float((kw["masked_lm_weights"] > 0).sum())
            total += float(out.mlm_loss) * n
            count += n
        self.model.release_caches()
        return total, count


def load_teacher(start, dtype=np.float32) -> Teacher:
    """The :class:`Teacher` of a starting point resolved by :func:`minibert.runs.load_start`
    (a Hugging Face BERT directory or a minibert run): a BertForPreTraining when its weights
    hold the MLM head (``cls.predictions.*``), else a bare BertModel (e.g. a
    sentence-embedding model such as all-MiniLM-L6-v2).

    Raises:
        HFFormatError: the encoder weights do not match the config, or the MLM head is
            there only in part.
    """
    if has_mlm_head(start.state):
        model, report = start.build(BertForPreTraining, dtype=dtype, seq_relationship_head=False)
    else:
        model, report = start.build(BertModel, add_pooling_layer=False, dtype=dtype)
    # cls.predictions. (ALBERT: predictions., DistilBERT: vocab_, ELECTRA:
    # generator_predictions.)
    head = MLM_HEAD_PREFIXES.get(type(start.config), "cls.predictions.")
    missing = [k for k in report["new"] if k.startswith(head)]
    if missing:
        raise HFFormatError(f"{start.source}: MLM head weights missing or mis-shaped: {missing}")
    return Teacher(model)
