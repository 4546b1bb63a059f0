"""Task distillation for sequence classification (``finetune.py --teacher DIR``): the
student learns from a fine-tuned teacher's soft labels as well as from the gold labels.

    loss = (1 - alpha) * CE(s, y) + alpha * T^2 * KL(softmax(t / T) || softmax(s / T))

s: the student's logits, t: the teacher's, y: the gold labels, T: the temperature. This is
the soft-target objective of Hinton et al. 2015 ("Distilling the Knowledge in a Neural
Network", section 2: the T^2 keeps the soft term's gradient scale independent of T), as
DistilBERT's task-specific distillation and Turc et al. 2019 ("Well-Read Students Learn
Better", section 3: pre-trained distillation, the student trained on the teacher's
predictive distribution) use it. The CE mean is over the rows with a gold label; rows of
an unlabelled transfer set (``--transfer-data``: in-domain text the teacher labels, Turc
et al.'s transfer set) carry the label -100 and count only in the soft term, whose mean is
over every row (:func:`~.losses.soft_label_loss_forward`, in :mod:`.losses`).

The teacher runs once, before training, in inference mode and with its own tokenizer
(:func:`teacher_logits`): its soft labels are a constant (N, K) table indexed by the rows
of each batch, so the teacher need not share the student's vocabulary, and a step costs
what a plain fine-tuning step costs.

Shape legend: N = rows (examples), B = batch rows, K = classes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..auto import bert_role
from ..cli import add_options, float_in
from ..finetuning.models import model_from_start, split_logits
from ..finetuning.data import DatasetError, EncodedSplit, Example, encode_split, text_lines
from ..heads import BertForSequenceClassification
from ..nn import IGNORE_INDEX
from ..runs import Pretrained, load_start
from ..tokenization import BertTokenizer
from .losses import soft_label_loss_backward, soft_label_loss_forward

__all__ = ["TASK_OPTIONS", "SoftTargets", "add_task_arguments", "read_transfer", "soft_targets",
           "teacher_logits", "with_transfer_rows"]

# Options that only mean something with finetune.py --teacher.
TASK_OPTIONS = ("distill_alpha", "temperature", "transfer_data")


def teacher_logits(teacher: Pretrained, examples: Sequence[Example], labels: Sequence[str],
                   max_seq_length: int, batch_size: int = 64, xp=np) -> np.ndarray:
    """The teacher's logits (N, K) float32 for ``examples``, columns in the order of the
    student's ``labels``.

    The examples are tokenized with the teacher's own vocabulary and options, truncated to
    ``max_seq_length`` (at most the teacher's position limit), and run in inference mode.

    Raises:
        ValueError: ``teacher`` is not a fine-tuned sequence classifier, or its label set
            differs from ``labels`` (the message names both).
    """
    arch = teacher.architecture
    if bert_role(arch) not in (None, BertForSequenceClassification.__name__) or not teacher.labels:
        raise ValueError(f"--teacher {teacher.source}: not a fine-tuned sequence classifier "
                         f"(architecture {arch}, labels {teacher.labels}); fine-tune one "
                         f"with finetune.py first")
    if sorted(teacher.labels) != sorted(labels):
        raise ValueError(f"--teacher {teacher.source}: its labels {list(teacher.labels)} "
                         f"differ from the train split's {list(labels)}")
    model, _ = model_from_start(teacher, BertForSequenceClassification, teacher.labels)
    model.to("cuda" if xp is not np else "cpu")
    tok = BertTokenizer(teacher.vocab_file, **teacher.tokenizer_options)
    max_len = min(max_seq_length, teacher.config.max_position_embeddings)
    split = encode_split(tok, examples, max_len)
    logits = split_logits(model, split, batch_size, 0, xp)            # (N, K) teacher order
    order = [list(teacher.labels).index(l) for l in labels]
    return logits[:, order]


def read_transfer(path: str | Path) -> list[Example]:
    """Unlabelled transfer-set rows: one example per line, ``sentence`` or
    ``sentence_a<TAB>sentence_b`` (no header; blank lines skipped); label "".

    Raises:
        DatasetError: missing or undecodable file, more than two columns, an empty column,
            or no rows (``path:line:`` first).
    """
    path = Path(path)
    rows = []
    for lineno, text in text_lines(path):
        if not text.strip():
            continue
        cols = text.split("\t")
        if len(cols) > 2:
            raise DatasetError(f"{path}:{lineno}: expected 'sentence' or "
                               f"'sentence_a<TAB>sentence_b', got {len(cols)} columns")
        if not all(c.strip() for c in cols):
            raise DatasetError(f"{path}:{lineno}: empty sentence")
        rows.append(Example(cols[0], cols[1] if len(cols) == 2 else None, "", lineno,
                            str(path)))
    if not rows:
        raise DatasetError(f"{path}: no rows (an empty transfer set)")
    return rows


def with_transfer_rows(split: EncodedSplit, tokenizer, rows: Sequence[Example],
                       max_seq_length: int) -> EncodedSplit:
    """``split`` followed by the transfer ``rows`` (encoded with the student's tokenizer),
    whose labels are -100 (no gold label)."""
    extra = encode_split(tokenizer, rows, max_seq_length)
    labels = np.concatenate([np.asarray(split.labels, dtype=np.int64),
                             np.full(len(rows), IGNORE_INDEX, dtype=np.int64)])
    return EncodedSplit(split.input_ids + extra.input_ids,
                        split.token_type_ids + extra.token_type_ids, labels,
                        list(split.examples) + list(rows))


class SoftTargets:
    """The soft-label objective in the loop: :meth:`forward` gives the loss and sums of a
    batch, :meth:`backward` back-propagates it (what ``model.backward(dloss=...)`` does for
    the plain loss).

    Args:
        logits: (N, K) the teacher's logits for every row of the train split (host).
        alpha, temperature: as :func:`soft_label_loss_forward`.
    """

    def __init__(self, logits: np.ndarray, alpha: float, temperature: float):
        self.logits, self.alpha, self.temperature = logits, float(alpha), float(temperature)
        self._cache = None

    def forward(self, model, batch, xp):
        """(loss, sums) of ``batch`` (a :class:`~minibert.finetuning.data.FinetuningBatch`): sums
        ``correct`` / ``count`` over the rows with a gold label, no device read."""
        labels = xp.asarray(batch.labels)                             # (B,)
        out = model(xp.asarray(batch.input_ids), xp.asarray(batch.token_type_ids),
                    xp.asarray(batch.attention_mask))
        teacher = xp.asarray(self.logits[batch.index]).astype(out.logits.dtype)
        loss, self._cache = soft_label_loss_forward(out.logits, labels, teacher,
                                                    self.alpha, self.temperature)
        gold = labels != IGNORE_INDEX
        return loss, {"correct": ((out.logits.argmax(-1) == labels) & gold).sum(),
                      "count": int((batch.labels != IGNORE_INDEX).sum())}

    def backward(self, model, dloss) -> None:
        """Gradients of the last :meth:`forward`'s loss, times ``dloss``, into ``model``."""
        cache, self._cache = self._cache, None
        model.backward(d_logits=soft_label_loss_backward(dloss, cache))


def add_task_arguments(g) -> None:
    """Task distillation's options (finetune.py): ``--teacher``, ``--distill-alpha``,
    ``--temperature``, ``--transfer-data``."""
    g.add_argument("--teacher", metavar="DIR", default=None,
                   help="a fine-tuned sequence classifier (finetune.py output or Hugging "
                        "Face directory) with the same labels: the student also learns from "
                        "its soft labels (Hinton et al. 2015)")
    g.add_argument("--distill-alpha", type=float_in(0.0, 1.0), default=0.5,
                   help="weight of the soft-label loss; 1 - it weighs the gold-label loss")
    add_options(g, temperature=2.0)
    g.add_argument("--transfer-data", metavar="FILE", default=None,
                   help="unlabelled in-domain text, one 'sentence' or 'sentence_a<TAB>"
                        "sentence_b' per line, added to the train rows with the teacher's "
                        "soft labels only (the transfer set of Turc et al. 2019)")


def soft_targets(cfg, tokenizer, train_split, labels, max_len, xp):
    """Task distillation's start (``finetune.py --teacher``): the teacher labels every
    train row once, before training.

    Args:
        cfg: finetune.py's options, a :class:`~minibert.finetuning.FinetuningConfig`
            (``teacher``, ``transfer_data``, ``distill_alpha``,
            ``temperature``, ``eval_batch_size``).
        train_split: the encoded train split; labels: the class names, in the model's
            order; max_len: tokens per row; xp: the array module of the device.
    Returns:
        (the train split with the ``--transfer-data`` rows added, the
        :class:`SoftTargets` of every row: (N, K) logits).
    Raises:
        ValueError: a teacher that cannot be loaded or has other labels (the message
            names ``--teacher``). DatasetError: a bad ``--transfer-data`` file.
    """
    try:
        teacher = load_start(cfg.teacher)
    except ValueError as e:
        raise ValueError(f"--teacher {cfg.teacher}: {e}") from None
    try:
        if cfg.transfer_data:
            rows = read_transfer(cfg.transfer_data)
            train_split = with_transfer_rows(train_split, tokenizer, rows, max_len)
        logits = teacher_logits(teacher, train_split.examples, labels, max_len,
                                cfg.eval_batch_size, xp)
    except DatasetError as e:
        raise DatasetError(f"--transfer-data {e}") from None
    gold = np.asarray(train_split.labels) >= 0
    agree = float((logits[gold].argmax(-1) == np.asarray(train_split.labels)[gold]).mean())
    print(f"teacher {teacher.source}: soft labels for {len(train_split)} train rows "
          f"({int((~gold).sum())} from --transfer-data), its train accuracy {agree:.4f}; "
          f"loss = {1 - cfg.distill_alpha:g} * CE + {cfg.distill_alpha:g} * "
          f"{cfg.temperature:g}^2 * KL at T = {cfg.temperature:g}")
    return train_split, SoftTargets(logits, cfg.distill_alpha, cfg.temperature)
