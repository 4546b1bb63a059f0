"""The fine-tuning tasks of ``finetune.py``: what differs between sequence classification,
token classification and extractive question answering, behind one interface, so that the
job around them (arguments, run directory, THE training loop of
:mod:`minibert.training`) is the same for all three.

A task (:data:`TASKS` by name: :class:`SequenceClassification`,
:class:`TokenClassification`, :class:`QuestionAnswering`) is made from the job's
options (:func:`make_task`) and gives:

* ``read(paths, tokenizer, max_len)`` -> :class:`TaskData`: the splits read, checked and
  encoded, the label set (of all splits, or of the ``labels`` option's file:
  :func:`~minibert.finetuning.data.choose_labels`), notes for the log (long sentences cut
  into windows, labels that only dev / test have, the most-frequent-tag baseline,
  features per question);
* ``model_from_start(pre, labels, ...)``: its model class (:data:`~TaskBase.model_class`)
  from a starting point (:func:`~minibert.finetuning.models.model_from_start`);
* ``forward(model, batch, xp)``: the loss and metric sums of one batch for the loop (device
  arrays and host counts: no device value is read);
* ``summarize(totals)``: train-record metrics from the summed sums;
* ``evaluate(model, split, batch_size, xp)``: metrics and predictions of a labelled split;
* ``write_predictions(directory, name, split, predictions)``: the predictions files;
* ``predict(model, tokenizer, labels, texts, xp)``: the lines ``--predict`` prints;
* ``record(labels)``: what a checkpoint keeps so that ``--model DIR`` rebuilds the task
  (:func:`task_for_model`).

:class:`FinetuningWorkload` adapts a task to :class:`minibert.training.Workload` (batches, forward,
summaries, dev evaluation that keeps the best model in ``best_model.npz``).

Shape legend: B = batch, T = tokens of the batch's longest row, K = labels / tags,
F = QA features (windows).
"""
from __future__ import annotations

import json
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..atomic import atomic_write_bytes
from ..auto import bert_role
from ..backend import to_numpy
from ..checkpoint import save_checkpoint
from ..heads import (BertForQuestionAnswering, BertForSequenceClassification,
                     BertForTokenClassification)
from .models import eval_batches, evaluate as evaluate_classifier, model_from_start
from .metrics import log_softmax_np
from .data import (DatasetError, EncodedSplit, LabelSet, choose_labels, encode_split,
                   iterate_batches, label_occurrences, read_tsv, sort_labels)
from .qa import (exact_match_score, f1_score, postprocess_qa_predictions,
                 prepare_qa_features, read_squad, squad_metrics)
from .tagging import (IGNORE_INDEX, MostFrequentTagBaseline, decode_tags,
                      encode_tagging, is_entity_tagset, read_conll, sort_tags, tag_occurrences,
                      tagging_metrics, warn_long_sentences)


@dataclass
class TaskData:
    """What :meth:`TaskBase.read` returns: ``labels`` (class names / tags; None for QA),
    the encoded ``train``, ``dev`` and ``test`` (None when skipped) splits, ``notes``
    (lines for the log), ``warnings`` (lines for stderr: sentences cut into windows,
    labels unseen in train ...), ``settings`` (saved with the model, e.g. the word unit
    of a tagger), ``baseline`` (the most-frequent-tag baseline's dev / test metrics,
    tagging only) and ``label_set`` (where the labels came from; None for QA)."""

    labels: list[str] | None
    train: EncodedSplit
    dev: EncodedSplit
    test: EncodedSplit | None
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    baseline: dict | None = None
    label_set: LabelSet | None = None


class TaskBase:
    """The interface (see the module docstring) and what the three tasks share.

    Class attributes: ``name`` (``--task``), ``model_class``, ``data_subdir`` (default data
    under the repository's ``data/``), ``ext`` (split files ``train.EXT`` ...),
    ``test_optional`` (no test split unless its file exists), ``metrics`` (``--metric``
    choices), ``default_max_seq_length``, ``curve_metrics`` (dev metrics plotted).
    """

    name = ""
    model_class: type = BertForSequenceClassification
    data_subdir = ""
    ext = "tsv"
    test_optional = False
    metrics: tuple[str, ...] = ()
    default_max_seq_length = 128
    curve_metrics: tuple[str, ...] = ()

    def __init__(self, options: Mapping[str, Any] | None = None, settings: dict | None = None,
                 labels: Sequence[str] | None = None):
        """``options``: the job's options by name (:meth:`FinetuningConfig.to_dict
        <minibert.finetuning.FinetuningConfig>`, or those given; missing or None ones take
        the saved ``settings``, then the defaults); ``settings``: a saved model's
        :meth:`record` settings; ``labels``: the label set (else set by :meth:`read`)."""
        self.options = dict(options or {})
        self.settings = dict(settings or {})
        self.labels = list(labels) if labels is not None else None
        self.metric = "auto"

    def option(self, name: str, default):
        v = self.options.get(name)
        return v if v is not None else self.settings.get(name, default)

    # -- metric ------------------------------------------------------------------------
    def resolve_metric(self, metric: str | None, labels) -> str:
        """The dev metric that picks the best model: ``metric``, or the task's default for
        "auto" / None. Raises ValueError for a metric the task does not report."""
        if metric in (None, "auto"):
            self.metric = self.default_metric(labels)
        elif metric not in self.available_metrics(labels):
            raise ValueError(f"--metric {metric}: {self.name} reports "
                             f"{', '.join(self.available_metrics(labels))}")
        else:
            self.metric = metric
        return self.metric

    def default_metric(self, labels) -> str:
        return self.metrics[0]

    def available_metrics(self, labels) -> tuple[str, ...]:
        return self.metrics

    # -- model -------------------------------------------------------------------------
    def model_from_start(self, pre, labels, seed: int = 0, random_init: bool = False,
                         classifier_dropout: float | None = None,
                         classifier_pooling: str | None = None):
        """(model, load report) of :attr:`model_class` from the starting point ``pre``."""
        return model_from_start(pre, self.model_class, labels, seed=seed,
                                random_init=random_init,
                                classifier_dropout=classifier_dropout,
                                classifier_pooling=classifier_pooling)

    def record(self, labels) -> dict:
        """Fields for a checkpoint's trainer record: the task, the model class, the label
        set and the task's settings (:func:`task_for_model` reads them back)."""
        return {"task": self.name, "architecture": self.model_class.__name__,
                "labels": labels, "task_settings": dict(self.settings)}

    def max_len(self, model_config) -> int:
        return min(int(self.option("max_seq_length", self.default_max_seq_length)),
                   model_config.max_position_embeddings)

    # -- data --------------------------------------------------------------------------
    @staticmethod
    def _read_splits(reader, paths, max_train_examples: int | None):
        """(train, dev, test) records of ``reader`` (a file -> list function) from
        ``paths``; test None when its path is; train cut to ``max_train_examples``."""
        train = reader(paths["train"])[:max_train_examples or None]
        dev = reader(paths["dev"])
        return train, dev, reader(paths["test"]) if paths["test"] is not None else None

    def _label_set(self, splits: tuple, occurrences, order, train_path, unit: str,
                   task: str) -> LabelSet:
        """The job's label set (:func:`~minibert.finetuning.data.choose_labels` with the
        ``labels`` option's file) from the (train, dev, test) records of :meth:`_read_splits`
        (test may be None); ``occurrences(records)`` gives label -> where it first occurs.

        Raises:
            DatasetError: the train split ``train_path`` has fewer than two ``unit``s, or
                the labels file is unreadable or misses a label of the data.
        """
        found = {name: occurrences(records)                  # test only when it has records
                 for name, records in zip(("train", "dev", "test"), splits)
                 if name != "test" or records}
        train = list(found["train"])
        if len(train) < 2:
            raise DatasetError(f"{train_path}: the train split has one {unit} only "
                               f"({train[0]!r}); {task} needs at least two")
        return choose_labels(found, order, self.option("labels", None), unit)

    # -- the loop ----------------------------------------------------------------------
    def summarize(self, totals: dict) -> dict:
        real, padded = totals.get("real_tokens", 0.0), totals.get("padded_tokens", 0.0)
        return {"real_tokens": int(real), "padded_tokens": int(padded),
                "padding_fraction": round(1.0 - real / padded, 4) if padded else None}

    @staticmethod
    def _token_counts(batch) -> dict:
        # the mask is the host batch's (B, T), or the static device buffer of a step
        # captured as a CUDA graph, whose count is then a device value: no host read
        mask = batch.attention_mask
        return {"real_tokens": mask.sum(), "padded_tokens": int(mask.size)}


# --------------------------------------------------------------------------------------
class SequenceClassification(TaskBase):
    """One label per sentence or sentence pair (``label<TAB>sentence[<TAB>sentence_b]``
    TSV with a header): :class:`~minibert.heads.BertForSequenceClassification`,
    accuracy / macro-F1 / MCC (:func:`~minibert.finetuning.classification_metrics`)."""

    name = "sequence-classification"
    model_class = BertForSequenceClassification
    data_subdir = "classify/en/movie_reviews"
    metrics = ("accuracy", "macro_f1", "mcc")
    curve_metrics = ("accuracy", "macro_f1", "mcc")

    def read(self, paths, tokenizer, max_len: int, max_train_examples: int | None = None
             ) -> TaskData:
        train_ex, dev_ex, test_ex = splits = self._read_splits(read_tsv, paths,
                                                                max_train_examples)
        chosen = self._label_set(splits, label_occurrences, sort_labels, paths["train"],
                                 "class", "classification")
        labels = chosen.labels
        enc = lambda ex: encode_split(tokenizer, ex, max_len, labels)  # noqa: E731
        self.labels, self.settings["max_seq_length"] = labels, max_len
        return TaskData(labels, enc(train_ex), enc(dev_ex), enc(test_ex) if test_ex else None,
                        warnings=chosen.notes("label"), label_set=chosen)

    def forward(self, model, batch, xp):
        labels = xp.asarray(batch.labels)
        out = model(xp.asarray(batch.input_ids), xp.asarray(batch.token_type_ids),
                    xp.asarray(batch.attention_mask), labels=labels)
        return out.loss, {"correct": (out.logits.argmax(-1) == labels).sum(),
                          "count": labels.shape[0], **self._token_counts(batch)}

    def summarize(self, totals: dict) -> dict:
        return {"accuracy": totals.get("correct", 0.0) / max(totals.get("count", 0.0), 1.0),
                **super().summarize(totals)}

    def evaluate(self, model, split, batch_size: int, xp, pad_id: int = 0):
        """(:func:`~minibert.finetuning.evaluate`'s metrics, (N, K) probabilities)."""
        return evaluate_classifier(model, split, batch_size, pad_id, xp)

    def describe(self, m: dict) -> str:
        return (f"accuracy {m['accuracy']:.4f} macro-F1 {m['macro_f1']:.4f} MCC "
                f"{m['mcc']:.4f} ({m['n']} examples)")

    def write_predictions(self, directory: Path, name: str, split, probs, labels) -> list[Path]:
        """``predictions_NAME.tsv``: line, gold, predicted, one probability column per
        label."""
        rows = ["line\tgold\tpredicted\t" + "\t".join(f"p_{l}" for l in labels)]
        for e, p in zip(split.examples, probs):
            rows.append(f"{e.line}\t{e.label}\t{labels[int(p.argmax())]}\t"
                        + "\t".join(f"{x:.6f}" for x in p))
        path = Path(directory) / f"predictions_{name}.tsv"
        atomic_write_bytes(path, ("\n".join(rows) + "\n").encode("utf-8"))
        return [path]



# --------------------------------------------------------------------------------------
class TokenClassification(TaskBase):
    """One tag per word (NER, part of speech): CoNLL ``word<TAB>tag`` files
    (:mod:`~minibert.finetuning.tagging`), :class:`~minibert.heads.BertForTokenClassification`
    with the tag on a word's first piece (every piece with ``--label-all-tokens``); token
    accuracy, and entity precision / recall / F1 (micro and per type, seqeval's
    conventions) when the tag set is BIO-like. The train records' ``accuracy`` is over
    labelled pieces; dev / test metrics are over words.

    Settings: ``label_all_tokens``; ``word_unit``: ``"char"`` when every train word is one
    character (Chinese NER: ``--predict`` then tags each character), else
    ``"whitespace"``.
    """

    name = "token-classification"
    model_class = BertForTokenClassification
    data_subdir = "tag/en/brown_pos"
    metrics = ("accuracy", "f1", "precision", "recall")
    curve_metrics = ("accuracy", "f1")

    def available_metrics(self, labels) -> tuple[str, ...]:
        return self.metrics if labels is None or is_entity_tagset(labels) else ("accuracy",)

    def default_metric(self, labels) -> str:
        return "f1" if labels is not None and is_entity_tagset(labels) else "accuracy"

    def resolve_metric(self, metric, labels) -> str:
        if metric in ("f1", "precision", "recall") and not is_entity_tagset(labels):
            raise ValueError(f"--metric {metric}: the tags {labels} are not "
                             f"entity tags (O, B-X, I-X ...), so only --metric accuracy "
                             f"applies")
        return super().resolve_metric(metric, labels)

    def _encode(self, tokenizer, sentences, max_len, tags, what: str, out: list[str]):
        with warnings.catch_warnings():          # the note is printed by the job instead
            warnings.simplefilter("ignore")
            split = encode_tagging(tokenizer, sentences, max_len, tags,
                                   label_all_tokens=bool(self.option("label_all_tokens", False)))
            note = warn_long_sentences(split, max_len, what)
        if note:
            out.append(note)
        return split

    def read(self, paths, tokenizer, max_len: int, max_train_examples: int | None = None
             ) -> TaskData:
        train_s, dev_s, test_s = splits = self._read_splits(read_conll, paths,
                                                             max_train_examples)
        chosen = self._label_set(splits, tag_occurrences, sort_tags, paths["train"], "tag",
                                 "tagging")
        tags = chosen.labels
        warn: list[str] = chosen.notes("tag")
        train = self._encode(tokenizer, train_s, max_len, tags, str(paths["train"]), warn)
        dev = self._encode(tokenizer, dev_s, max_len, tags, str(paths["dev"]), warn)
        test = (self._encode(tokenizer, test_s, max_len, tags, str(paths["test"]), warn)
                if test_s else None)
        self.settings["word_unit"] = ("char" if all(len(w) == 1 for s in train_s
                                                    for w in s.words) else "whitespace")
        self.settings["label_all_tokens"] = bool(self.option("label_all_tokens", False))
        self.settings["max_seq_length"] = max_len
        self.labels = tags
        base = MostFrequentTagBaseline().fit(train_s)
        baseline = {"dev": base.score(dev_s), "test": base.score(test_s) if test_s else None}
        d = baseline["dev"]
        note = (f"most-frequent-tag baseline (train {len(train_s)} sentences) on dev: "
                f"accuracy {d['accuracy']:.4f}")
        if "f1" in d:
            note += f", entity P {d['precision']:.4f} R {d['recall']:.4f} F1 {d['f1']:.4f}"
        words = sum(len(s.words) for s in train_s)
        return TaskData(tags, train, dev, test, notes=[
            f"tags ({len(tags)}): {' '.join(tags)}; train {len(train_s)} sentences, "
            f"{words} words ({self.settings['word_unit']} words)", note],
            warnings=warn, settings=dict(self.settings), baseline=baseline, label_set=chosen)

    def forward(self, model, batch, xp):
        labels = xp.asarray(batch.labels)                                  # (B, T)
        out = model(xp.asarray(batch.input_ids), xp.asarray(batch.token_type_ids),
                    xp.asarray(batch.attention_mask), labels=labels)
        scored = labels != IGNORE_INDEX
        correct = ((out.logits.argmax(-1) == labels) & scored).sum()
        return out.loss, {"correct": correct,
                          "count": int((batch.labels != IGNORE_INDEX).sum()),   # host
                          **self._token_counts(batch)}

    def summarize(self, totals: dict) -> dict:
        return {"accuracy": totals.get("correct", 0.0) / max(totals.get("count", 0.0), 1.0),
                **super().summarize(totals)}

    def row_probabilities(self, model, split, batch_size, xp, pad_id=0):
        """Per row of ``split``, (T_r, K) float64 tag probabilities (the softmax of the
        logits); and the mean cross-entropy (nats) over the labelled pieces (0 without
        labels). One device read per batch."""
        probs: list[np.ndarray | None] = [None] * len(split)
        loss_sum, n = 0.0, 0
        for b, out in eval_batches(model, split, batch_size, pad_id, xp):
            logp = log_softmax_np(to_numpy(out.logits).astype(np.float64))  # (B, T, K)
            if b.labels is not None:
                m = b.labels != IGNORE_INDEX
                loss_sum -= float(logp[m][np.arange(int(m.sum())), b.labels[m]].sum())
                n += int(m.sum())
            for r, i in enumerate(b.index):
                probs[i] = np.exp(logp[r, :len(split.input_ids[i])])
        return probs, loss_sum / max(n, 1)

    def evaluate(self, model, split, batch_size: int, xp, pad_id: int = 0):
        """(:func:`~minibert.finetuning.tagging_metrics` + ``loss``, predicted tags per
        sentence)."""
        tags = self.labels
        probs, loss = self.row_probabilities(model, split, batch_size, xp, pad_id)
        words = decode_tags(split, probs, tags)
        m = tagging_metrics([s.tags for s in split.sentences], words, tags)
        m["loss"] = loss
        return m, words

    def describe(self, m: dict) -> str:
        s = f"accuracy {m['accuracy']:.4f}"
        if "f1" in m:
            s += (f" entity P {m['precision']:.4f} R {m['recall']:.4f} F1 {m['f1']:.4f} ("
                  + ", ".join(f"{t} {v['f1']:.3f}/{v['support']}"
                              for t, v in m["per_type"].items()) + " F1/support)")
        return s + f" ({m['n_words']} words)"

    def write_predictions(self, directory: Path, name: str, split, words, labels) -> list[Path]:
        """``predictions_NAME.tsv``: CoNLL ``word<TAB>gold<TAB>predicted``, a blank line
        between sentences (conlleval's input, tab-separated)."""
        lines = []
        for s, pred in zip(split.sentences, words):
            lines += [f"{w}\t{g}\t{p}" for w, g, p in zip(s.words, s.tags, pred)] + [""]
        path = Path(directory) / f"predictions_{name}.tsv"
        atomic_write_bytes(path, ("\n".join(lines)).encode("utf-8"))
        return [path]

    def word_spans(self, text: str) -> list[tuple[str, int, int]]:
        """The words of a text to tag, each with its character offsets ``(word, start,
        end)``: its characters (spaces dropped) for a character-level tagger (settings
        ``word_unit == "char"``), else its whitespace-separated words."""
        pattern = r"\S" if self.option("word_unit", "whitespace") == "char" else r"\S+"
        return [(m.group(), m.start(), m.end()) for m in re.finditer(pattern, text)]



# --------------------------------------------------------------------------------------
class QuestionAnswering(TaskBase):
    """Extractive QA, SQuAD v1.1 (:mod:`~minibert.finetuning.qa`): JSON lines or nested
    SQuAD JSON, ``[CLS] question [SEP] context window [SEP]`` features with
    ``doc_stride`` overlap, :class:`~minibert.heads.BertForQuestionAnswering`, n-best
    answer extraction and the official exact match / F1 (percent). The train records give
    ``start_accuracy``, ``end_accuracy`` and ``span_accuracy`` over features (the
    [CLS] label of a window without the answer included).

    Settings: ``doc_stride``, ``max_query_length``, ``n_best_size``,
    ``max_answer_length``, ``max_seq_length``.
    """

    name = "question-answering"
    model_class = BertForQuestionAnswering
    data_subdir = "qa/en/squad_v1"
    ext = "jsonl"
    test_optional = True
    metrics = ("f1", "exact_match")
    default_max_seq_length = 384
    curve_metrics = ("exact_match", "f1")

    def _settings(self) -> dict:
        return {"doc_stride": int(self.option("doc_stride", 128)),
                "max_query_length": int(self.option("max_query_length", 64)),
                "n_best_size": int(self.option("n_best_size", 20)),
                "max_answer_length": int(self.option("max_answer_length", 30))}

    def features(self, tokenizer, examples, max_len):
        s = self._settings()
        return prepare_qa_features(tokenizer, examples, max_len, s["doc_stride"],
                                   s["max_query_length"])

    def read(self, paths, tokenizer, max_len: int, max_train_examples: int | None = None
             ) -> TaskData:
        train_ex, dev_ex, test_ex = self._read_splits(read_squad, paths, max_train_examples)
        train = self.features(tokenizer, train_ex, max_len)
        dev = self.features(tokenizer, dev_ex, max_len)
        test = self.features(tokenizer, test_ex, max_len) if test_ex else None
        self.settings.update(self._settings(), max_seq_length=max_len)
        no_answer = int((train.labels == 0).all(axis=1).sum())
        s = self._settings()
        note = (f"question answering: train {len(train_ex)} questions -> {len(train)} "
                f"features, dev {len(dev_ex)} -> {len(dev)}"
                + (f", test {len(test_ex)} -> {len(test)}" if test else "")
                + f" (windows of {max_len} tokens sharing {s['doc_stride']}, questions cut "
                  f"to {s['max_query_length']} tokens); {no_answer} train features do not "
                  f"hold their answer and point at [CLS]")
        return TaskData(None, train, dev, test, notes=[note], settings=dict(self.settings))

    def forward(self, model, batch, xp):
        pos = xp.asarray(batch.labels)                                     # (B, 2)
        out = model(xp.asarray(batch.input_ids), xp.asarray(batch.token_type_ids),
                    xp.asarray(batch.attention_mask), start_positions=pos[:, 0],
                    end_positions=pos[:, 1])
        s_ok = out.start_logits.argmax(-1) == pos[:, 0]
        e_ok = out.end_logits.argmax(-1) == pos[:, 1]
        return out.loss, {"start_correct": s_ok.sum(), "end_correct": e_ok.sum(),
                          "span_correct": (s_ok & e_ok).sum(), "count": pos.shape[0],
                          **self._token_counts(batch)}

    def summarize(self, totals: dict) -> dict:
        n = max(totals.get("count", 0.0), 1.0)
        return {k + "_accuracy": totals.get(k + "_correct", 0.0) / n
                for k in ("start", "end", "span")} | super().summarize(totals)

    def logits(self, model, split, batch_size, xp, pad_id=0):
        """Per feature (T_f,) start and end logits (float64), and the mean loss
        ((start CE + end CE) / 2 over the padded batch, as the model's; 0 without
        labels)."""
        F = len(split)
        starts: list = [None] * F
        ends: list = [None] * F
        loss_sum = 0.0
        for b, out in eval_batches(model, split, batch_size, pad_id, xp):
            s = to_numpy(out.start_logits).astype(np.float64)              # (B, T)
            e = to_numpy(out.end_logits).astype(np.float64)
            if b.labels is not None:
                rows = np.arange(len(b.index))
                loss_sum -= float((log_softmax_np(s)[rows, b.labels[:, 0]]
                                   + log_softmax_np(e)[rows, b.labels[:, 1]]).sum()) / 2
            for r, i in enumerate(b.index):
                n = len(split.input_ids[i])
                starts[i], ends[i] = s[r, :n], e[r, :n]
        return starts, ends, loss_sum / max(F, 1)

    def answers(self, model, split, batch_size, xp, pad_id=0):
        starts, ends, loss = self.logits(model, split, batch_size, xp, pad_id)
        s = self._settings()
        preds = postprocess_qa_predictions(split, starts, ends, s["n_best_size"],
                                           s["max_answer_length"])
        return preds, loss

    def evaluate(self, model, split, batch_size: int, xp, pad_id: int = 0):
        """(:func:`~minibert.finetuning.squad_metrics` + ``loss`` (features) and
        ``n_features``, {id: :class:`~minibert.finetuning.QAPrediction`})."""
        preds, loss = self.answers(model, split, batch_size, xp, pad_id)
        m = squad_metrics(split.examples, preds)
        m["loss"], m["n_features"] = loss, len(split)
        return m, preds

    def describe(self, m: dict) -> str:
        return f"exact match {m['exact_match']:.2f} F1 {m['f1']:.2f} ({m['n']} questions)"

    def write_predictions(self, directory: Path, name: str, split, preds, labels) -> list[Path]:
        """``predictions_NAME.json``: {id: answer text}, the input of SQuAD's official
        ``evaluate-v1.1.py``; ``predictions_NAME.tsv``: line, id, score (start + end
        logit), exact match, F1, predicted answer, gold answers (`` | ``-separated)."""
        directory = Path(directory)
        jpath = directory / f"predictions_{name}.json"
        atomic_write_bytes(jpath, json.dumps({k: p.text for k, p in preds.items()},
                                             ensure_ascii=False, indent=1).encode("utf-8"))
        clean = lambda t: " ".join(t.split())  # noqa: E731  (no tabs / newlines in a cell)
        rows = ["line\tid\tscore\texact_match\tf1\tpredicted\tgold"]
        for ex in split.examples:
            p = preds[ex.id]
            em = max(exact_match_score(p.text, g) for g in ex.answers) if ex.answers else 0.0
            f1 = max(f1_score(p.text, g) for g in ex.answers) if ex.answers else 0.0
            rows.append(f"{ex.line}\t{ex.id}\t{p.score:.4f}\t{em:.0f}\t{f1:.4f}\t"
                        f"{clean(p.text)}\t{' | '.join(clean(g) for g in ex.answers)}")
        tpath = directory / f"predictions_{name}.tsv"
        atomic_write_bytes(tpath, ("\n".join(rows) + "\n").encode("utf-8"))
        return [jpath, tpath]



TASKS: dict[str, type[TaskBase]] = {t.name: t for t in (SequenceClassification,
                                                          TokenClassification,
                                                          QuestionAnswering)}


def make_task(name: str, options: Mapping[str, Any] | None = None,
              settings: dict | None = None, labels: Sequence[str] | None = None) -> TaskBase:
    """The task ``name`` (a key of :data:`TASKS`) for the job's ``options`` (by name).

    Raises:
        ValueError: an unknown name.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; one of {', '.join(TASKS)}")
    return TASKS[name](options, settings, labels)


def task_for_model(pre, options: Mapping[str, Any] | None = None) -> TaskBase | None:
    """The task of a fine-tuned starting point (:class:`~minibert.runs.Pretrained`): from
    its recorded ``task`` / model class, with its saved settings; None when ``pre`` is no
    fine-tuned model of one of :data:`TASKS` (e.g. a pretraining checkpoint). ``options``
    (by name) override the saved settings."""
    name = pre.trainer.get("task")
    if name is None:
        name = next((t.name for t in TASKS.values()
                     if t.model_class.__name__ == bert_role(pre.architecture)), None)
    if name not in TASKS or (TASKS[name].model_class is not BertForQuestionAnswering
                             and not pre.labels):
        return None
    return make_task(name, options, pre.trainer.get("task_settings"), pre.labels)


# --------------------------------------------------------------------------------------
class FinetuningWorkload:
    """The workload of a fine-tuning job for :func:`minibert.training.train` (a
    :class:`minibert.training.Workload`): shuffled epochs of the train split (grouped by
    length with ``cfg.group_by_length``), the task's forward and
    train metrics, and dev evaluation that keeps the best model in ``best_model.npz``.

    Train records get, besides the loop's ``tokens_per_s`` (real tokens, i.e.
    attention-mask ones, per second of the log window): ``real_tokens`` and
    ``padded_tokens`` (B x T summed over the window's applied steps) and
    ``padding_fraction`` = 1 - real / padded; the padded tokens/s are
    ``tokens_per_s / (1 - padding_fraction)``. ``eval_seconds`` sums the time spent in
    dev evaluations.

    Args:
        cfg: the job's :class:`~minibert.finetuning.FinetuningConfig` (``batch_size``,
            ``seed``, ``group_by_length``, ``eval_batch_size``, ``metric``).
        task: the :class:`TaskBase` (default: sequence classification with ``cfg``).
        soft: a :class:`~minibert.distillation.SoftTargets` (task distillation: the
            loss on the teacher's soft labels replaces the task's loss), or None.
    """

    def __init__(self, cfg, run, model, train_split, dev_split, labels, pre, xp,
                 best: dict | None = None, task: TaskBase | None = None, soft=None):
        self.cfg, self.run, self.model, self.xp = cfg, run, model, xp
        self.soft = soft
        self.train_split, self.dev_split = train_split, dev_split
        self.labels, self.pre = labels, pre
        self.task = task or SequenceClassification(cfg.to_dict())
        if self.task.labels is None:
            self.task.labels = labels
        if self.task.metric == "auto":
            self.task.resolve_metric(cfg.metric, labels)
        self.pad_id = 0
        self.best = best or {"metric": None, "step": None}
        self.eval_seconds = 0.0
        self.evaluate = self._evaluate

    def batches(self, epoch: int, start_batch: int):
        return iterate_batches(self.train_split, self.cfg.batch_size, self.pad_id,
                               seed=self.cfg.seed, epoch=epoch, start_batch=start_batch,
                               group_by_length=self.cfg.group_by_length)

    def forward(self, model, batch):
        if self.soft is None:
            return self.task.forward(model, batch, self.xp)
        loss, sums = self.soft.forward(model, batch, self.xp)
        return loss, sums | self.task._token_counts(batch)

    def backward(self, model, dloss) -> None:
        if self.soft is None:
            model.backward(dloss=dloss)
        else:
            self.soft.backward(model, dloss)

    def summarize(self, totals: dict) -> dict:
        return self.task.summarize(totals)

    def best_record(self, step: int, dev: dict) -> dict:
        """The trainer record of ``best_model.npz``."""
        return {"job": "finetune", "step": step, "dev": dev,
                "tokenizer": dict(self.pre.tokenizer_options), "init": self.pre.source,
                **self.task.record(self.labels)}

    def _evaluate(self, step: int) -> dict:
        t0 = time.perf_counter()
        m, _ = self.task.evaluate(self.model, self.dev_split, self.cfg.eval_batch_size,
                                  self.xp, self.pad_id)
        value = m[self.task.metric]
        if self.best["metric"] is None or value > self.best["metric"]:
            self.best = {"metric": value, "step": step}
            save_checkpoint(self.run.best_model, self.model, None, self.best_record(step, m))
        self.eval_seconds += time.perf_counter() - t0
        return {"dev_" + k: v for k, v in m.items()
                if isinstance(v, float) or k == "per_type"} | {"best_step": self.best["step"]}

    def trainer_record(self) -> dict:
        return {"job": "finetune", "args": self.cfg.to_dict(),
                "tokenizer": dict(self.pre.tokenizer_options), "best": self.best,
                **self.task.record(self.labels)}


__all__ = ["TaskData", "TaskBase", "SequenceClassification", "TokenClassification",
           "QuestionAnswering", "TASKS", "make_task", "task_for_model", "FinetuningWorkload"]
