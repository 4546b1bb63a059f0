"""Fine-tuning helpers: labelled TSV data, dynamic-padding batches, metrics, and loading a
starting model from a minibert run, a minibert checkpoint or a Hugging Face directory.

TSV format (UTF-8, tab-separated, one header line): ``label<TAB>sentence`` for single
sentences or ``label<TAB>sentence_a<TAB>sentence_b`` for pairs. Labels are strings (``0``,
``pos``, ``HUM`` ...); the label set is the sorted set of the train split's labels (in
numeric order when they are all integers) and is saved with the model. Errors name the
file and the 1-based line.

Shape legend: B = batch, T = longest sequence in the batch (tokens), K = labels.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from .backend import to_numpy
from .checkpoint import atomic_copy, atomic_write, load_checkpoint, save_checkpoint
from .hf import is_hf_directory, load_hf_directory, load_pretrained_weights
from .modeling import BertConfig, BertForSequenceClassification
from .tokenization import BertTokenizer

SINGLE_COLUMNS = ("label", "sentence")
PAIR_COLUMNS = ("label", "sentence_a", "sentence_b")


class DatasetError(ValueError):
    """A TSV split that cannot be used; the message names the file and line."""


@dataclass
class Example:
    """One labelled row: ``text_a``, ``text_b`` (None for single sentences), ``label``
    (the label string as written) and ``line`` (1-based line number in ``path``)."""

    text_a: str
    text_b: str | None
    label: str
    line: int
    path: str = ""


def read_tsv(path: str | os.PathLike) -> list[Example]:
    """Read a labelled TSV split (see the module docstring).

    Args:
        path: the file.
    Returns:
        the examples in file order (at least one).
    Raises:
        DatasetError: missing file, a header other than ``label, sentence`` or
            ``label, sentence_a, sentence_b``, a row with a missing (or extra) column or an
            empty label / sentence, an undecodable line, or no rows at all (empty split);
            each message starts with ``path:line:``.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    examples: list[Example] = []
    header = None
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(f"{path}:{lineno}: not valid UTF-8 ({e})") from e
            text = text.rstrip("\r\n")
            if lineno == 1:
                header = tuple(c.strip().lower() for c in text.lstrip("\ufeff").split("\t"))
                if header not in (SINGLE_COLUMNS, PAIR_COLUMNS):
                    raise DatasetError(
                        f"{path}:1: header must be 'label<TAB>sentence' or "
                        f"'label<TAB>sentence_a<TAB>sentence_b', got {text!r}")
                continue
            if not text.strip():
                continue  # blank lines (e.g. a trailing one) are not rows
            cols = text.split("\t")
            if len(cols) != len(header):
                missing = [c for c in header[len(cols):]]
                what = (f"missing column(s) {', '.join(missing)}" if missing
                        else f"{len(cols) - len(header)} extra column(s)")
                raise DatasetError(f"{path}:{lineno}: expected {len(header)} tab-separated "
                                   f"columns ({', '.join(header)}), got {len(cols)}: {what}")
            for name, value in zip(header, cols):
                if not value.strip():
                    raise DatasetError(f"{path}:{lineno}: empty {name}")
            label = cols[0].strip()
            examples.append(Example(cols[1], cols[2] if len(cols) == 3 else None, label, lineno,
                                    str(path)))
    if header is None:
        raise DatasetError(f"{path}:1: empty split (an empty file: no header, no rows)")
    if not examples:
        raise DatasetError(f"{path}:2: empty split (a header and no labelled rows)")
    return examples


def label_list(examples: Sequence[Example]) -> list[str]:
    """The label set of a (train) split: sorted, numerically when every label is an
    integer ("2" before "10"), else as strings. Index = class id."""
    labels = {e.label for e in examples}
    try:
        return sorted(labels, key=int)
    except ValueError:
        return sorted(labels)


def label_ids(examples: Sequence[Example], labels: Sequence[str]) -> np.ndarray:
    """(N,) int64 class ids of ``examples`` under ``labels``.

    Raises:
        DatasetError: a label not in ``labels`` (``path:line: unknown label``), naming the
            known ones.
    """
    index = {l: i for i, l in enumerate(labels)}
    out = np.empty(len(examples), dtype=np.int64)
    for i, e in enumerate(examples):
        if e.label not in index:
            raise DatasetError(f"{e.path}:{e.line}: unknown label {e.label!r}; the train "
                               f"split's labels are {list(labels)}")
        out[i] = index[e.label]
    return out


@dataclass
class EncodedSplit:
    """Token ids of one split, unpadded: ``input_ids`` / ``token_type_ids`` lists of int
    lists (lengths <= max_seq_length), ``labels`` (N,) int64 or None."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    labels: np.ndarray | None
    examples: list[Example] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)


def encode_split(tokenizer: BertTokenizer, examples: Sequence[Example], max_seq_length: int,
                 labels: Sequence[str] | None = None) -> EncodedSplit:
    """Tokenize ``[CLS] a [SEP]`` / ``[CLS] a [SEP] b [SEP]`` with longest-first truncation
    to ``max_seq_length`` tokens (google-research/bert ``_truncate_seq_pair``).

    Raises:
        DatasetError: an unknown label (see :func:`label_ids`).
        ValueError: max_seq_length too small for the special tokens.
    """
    ids, types = [], []
    for e in examples:
        enc = tokenizer(e.text_a, e.text_b, truncation=True, max_length=max_seq_length)
        ids.append(enc["input_ids"])
        types.append(enc["token_type_ids"])
    y = label_ids(examples, labels) if labels is not None else None
    return EncodedSplit(ids, types, y, list(examples))


@dataclass
class Batch:
    """One padded batch: input_ids, token_type_ids, attention_mask (B, T) int64 with T the
    longest row of this batch (dynamic padding), labels (B,) int64 or None, index (B,)
    positions of the rows in their split."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    labels: np.ndarray | None
    index: np.ndarray

    def to(self, xp) -> "Batch":
        """The same batch with its arrays on ``xp``'s device (numpy: unchanged)."""
        if xp is np:
            return self
        return Batch(*(xp.asarray(a) if a is not None else None for a in
                       (self.input_ids, self.token_type_ids, self.attention_mask,
                        self.labels)), self.index)


def pad_batch(split: EncodedSplit, index: Sequence[int], pad_id: int = 0) -> Batch:
    """Pad the rows ``index`` of ``split`` to their longest length (right padding with
    ``pad_id``, token type 0, attention 0)."""
    index = np.asarray(index, dtype=np.int64)
    T = max(len(split.input_ids[i]) for i in index)
    B = len(index)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    tt = np.zeros((B, T), dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.int64)
    for r, i in enumerate(index):
        n = len(split.input_ids[i])
        ids[r, :n] = split.input_ids[i]
        tt[r, :n] = split.token_type_ids[i]
        mask[r, :n] = 1
    labels = split.labels[index] if split.labels is not None else None
    return Batch(ids, tt, mask, labels, index)


def iterate_batches(split: EncodedSplit, batch_size: int, rng: np.random.Generator | None = None,
                    pad_id: int = 0) -> Iterator[Batch]:
    """Batches of ``batch_size`` rows (the last may be smaller), shuffled by ``rng`` if
    given (one permutation per call = per epoch), else in split order."""
    order = rng.permutation(len(split)) if rng is not None else np.arange(len(split))
    for s in range(0, len(order), batch_size):
        yield pad_batch(split, order[s:s + batch_size], pad_id)


# ---------------------------------------------------------------------------------------
# Metrics (written here; standard definitions)
# ---------------------------------------------------------------------------------------

def confusion_matrix(gold: np.ndarray, pred: np.ndarray, num_labels: int) -> np.ndarray:
    """(K, K) int64 counts, rows = gold class, columns = predicted class."""
    m = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(m, (np.asarray(gold), np.asarray(pred)), 1)
    return m


def classification_metrics(gold, pred, num_labels: int) -> dict[str, float]:
    """Accuracy, macro-F1 and Matthews correlation of integer predictions.

    * accuracy = (1/N) sum_i [pred_i = gold_i]
    * macro-F1 = (1/K) sum_k 2 TP_k / (2 TP_k + FP_k + FN_k), a class with no gold and no
      predicted example scoring 0 (scikit-learn's ``f1_score(average="macro",
      zero_division=0)`` over all K labels).
    * MCC, multi-class (Gorodkin 2004, "Comparing two K-category assignments by a
      K-category correlation coefficient"; = Matthews 1975 for K = 2): with confusion
      matrix C, c = trace(C), s = N, t_k = row sums (gold), p_k = column sums (predicted),
      MCC = (c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2)(s^2 - sum_k t_k^2)),
      0 when the denominator is 0 (as scikit-learn).

    Args:
        gold, pred: (N,) int class ids in [0, K). num_labels: K.
    Returns:
        {"accuracy", "macro_f1", "mcc"} as Python floats, and "n" (int).
    Raises:
        ValueError: shapes differ or N = 0.
    """
    gold, pred = np.asarray(gold), np.asarray(pred)
    if gold.shape != pred.shape or gold.ndim != 1 or gold.size == 0:
        raise ValueError(f"metrics need two non-empty (N,) arrays, got {gold.shape} and "
                         f"{pred.shape}")
    C = confusion_matrix(gold, pred, num_labels).astype(np.float64)
    tp = np.diag(C)
    fp = C.sum(axis=0) - tp
    fn = C.sum(axis=1) - tp
    denom = 2 * tp + fp + fn
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    s, c = C.sum(), tp.sum()
    t, p = C.sum(axis=1), C.sum(axis=0)
    den = np.sqrt((s * s - (p * p).sum()) * (s * s - (t * t).sum()))
    mcc = float((c * s - (p * t).sum()) / den) if den > 0 else 0.0
    return {"accuracy": float(c / s), "macro_f1": float(f1.mean()), "mcc": mcc,
            "n": int(gold.size)}


def softmax_np(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of (N, K) logits, max-subtracted; returns float64 (N, K)."""
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def predict_split(model: BertForSequenceClassification, split: EncodedSplit, batch_size: int,
                  pad_id: int = 0, xp=np, progress=None) -> np.ndarray:
    """Class probabilities (N, K) float64 of every row of ``split`` (eval mode, no dropout).
    The model is put back in its previous train/eval mode afterwards."""
    was_training = model.training
    model.eval()
    probs = np.zeros((len(split), model.num_labels))
    try:
        for b in iterate_batches(split, batch_size, pad_id=pad_id):
            d = b.to(xp)
            logits = model(d.input_ids, d.token_type_ids, d.attention_mask).logits
            probs[b.index] = softmax_np(to_numpy(logits))
            if progress is not None:
                progress.update(len(b.index))
    finally:
        model.train(was_training)
    return probs


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


# ---------------------------------------------------------------------------------------
# Starting points and fine-tuned model directories
# ---------------------------------------------------------------------------------------

@dataclass
class Pretrained:
    """A starting model resolved by :func:`load_pretrained`.

    config: its BertConfig; state: name -> array (``bert.*`` ...); vocab_file: Path;
    tokenizer_options: BertTokenizer keyword arguments; labels: the label list when the
    source is a fine-tuned classifier, else None; source: a description for messages.
    """

    config: BertConfig
    state: dict[str, np.ndarray]
    vocab_file: Path
    tokenizer_options: dict[str, Any]
    labels: list[str] | None
    source: str


def load_pretrained(path: str | os.PathLike) -> Pretrained:
    """Resolve a starting model.

    Accepted:
        * a Hugging Face BERT directory (config.json with model_type bert,
          model.safetensors, vocab.txt; see :mod:`minibert.hf`);
        * a ``train_mlm.py`` or ``finetune.py`` run directory (checkpoint.npz, vocab.txt);
        * a checkpoint ``.npz`` file with ``vocab.txt`` beside it.
    The tokenizer's lower-casing comes from the run's saved arguments (``lowercase``) or
    the fine-tuned model's ``tokenizer`` record, default lower-case.

    Raises:
        FileNotFoundError: nothing at ``path``, or no vocab.txt beside a checkpoint.
        CheckpointError / HFFormatError: a file that cannot be read.
    """
    path = Path(path)
    if path.is_dir() and is_hf_directory(path) and not (path / "checkpoint.npz").is_file():
        ck = load_hf_directory(path)
        labels = ([ck.id2label[i] for i in range(len(ck.id2label))]
                  if ck.id2label and any(k.startswith("classifier.") for k in ck.state)
                  else None)
        return Pretrained(ck.config, ck.state, ck.vocab_file, ck.tokenizer_options, labels,
                          f"Hugging Face directory {path}")
    ckpt = path / "checkpoint.npz" if path.is_dir() else path
    if not ckpt.is_file():
        raise FileNotFoundError(
            f"--init {path}: not a Hugging Face BERT directory (config.json + "
            "model.safetensors + vocab.txt), a run directory with checkpoint.npz, or a "
            "checkpoint file")
    vocab = ckpt.parent / "vocab.txt"
    if not vocab.is_file():
        raise FileNotFoundError(f"--init {path}: no vocab.txt beside {ckpt}")
    c = load_checkpoint(ckpt)
    trainer = c["trainer"]
    tok = dict(trainer.get("tokenizer") or {})
    if not tok and "lowercase" in trainer.get("args", {}):
        tok = {"do_lower_case": bool(trainer["args"]["lowercase"])}
    tok.setdefault("do_lower_case", True)
    return Pretrained(c["config"], c["model"], vocab, tok, trainer.get("labels"),
                      f"minibert checkpoint {ckpt}")


def build_classifier(pre: Pretrained, labels: Sequence[str], seed: int = 0, dtype=np.float32,
                     random_init: bool = False, classifier_dropout: float | None = None
                     ) -> tuple[BertForSequenceClassification, dict[str, list[str]]]:
    """A :class:`BertForSequenceClassification` with ``len(labels)`` classes, weights from
    ``pre`` (the classifier too when ``pre`` is a classifier with the same labels), or all
    fresh when ``random_init`` (same architecture and vocab, for baselines).

    Returns:
        (model, report) with report as :func:`minibert.hf.load_pretrained_weights`.
    Raises:
        HFFormatError: encoder weights that do not fit the config.
    """
    kw = pre.config.to_dict()
    kw["num_labels"] = len(labels)
    if classifier_dropout is not None:
        kw["classifier_dropout"] = classifier_dropout
    model = BertForSequenceClassification(BertConfig(**kw), seed=seed, dtype=dtype)
    if random_init:
        return model, {"loaded": [], "new": [n for n, _ in model.named_parameters()],
                       "unused": sorted(pre.state)}
    state = dict(pre.state)
    if pre.labels is not None and list(pre.labels) != list(labels):
        state = {k: v for k, v in state.items() if not k.startswith("classifier.")}
    return model, load_pretrained_weights(model, state, pre.source)


def save_finetuned(out_dir: str | os.PathLike, model: BertForSequenceClassification,
                   labels: Sequence[str], vocab_file: str | os.PathLike,
                   tokenizer_options: dict[str, Any], trainer_state: dict[str, Any]) -> Path:
    """Write a fine-tuned model directory (each file atomically): ``checkpoint.npz``
    (model, config, and ``labels`` / ``tokenizer`` in its trainer record), ``vocab.txt``,
    ``labels.json`` and ``config.json``. It loads back with :func:`load_pretrained`.
    Returns the checkpoint path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = dict(trainer_state, labels=list(labels), tokenizer=dict(tokenizer_options))
    path = save_checkpoint(out / "checkpoint.npz", model, None, state)
    atomic_copy(vocab_file, out / "vocab.txt")
    atomic_write(out / "labels.json",
                 lambda f: f.write(json.dumps(list(labels), ensure_ascii=False).encode()))
    atomic_write(out / "config.json", lambda f: f.write(model.config.to_json().encode()))
    return path


__all__ = ["DatasetError", "Example", "read_tsv", "label_list", "label_ids", "EncodedSplit",
           "encode_split", "Batch", "pad_batch", "iterate_batches", "confusion_matrix",
           "classification_metrics", "softmax_np", "predict_split", "evaluate", "Pretrained",
           "load_pretrained", "build_classifier", "save_finetuned"]
