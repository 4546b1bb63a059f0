"""Labelled TSV data for fine-tuning: reading, label sets, encoding, shuffled batches
(optionally grouped by length).

TSV format (UTF-8, tab-separated, one header line): ``label<TAB>sentence`` for single
sentences or ``label<TAB>sentence_a<TAB>sentence_b`` for pairs. Labels are strings (``0``,
``pos``, ``HUM`` ...); the label set is the sorted set of the labels of all splits (in
numeric order when they are all integers), or the lines of a labels file
(:func:`choose_labels`), and is saved with the model. Errors name the file and the
1-based line.

Shape legend: B = batch, T = longest sequence in the batch (tokens), K = labels.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from ..textfiles import utf8_lines
from ..tokenization import BertTokenizer
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


def text_lines(path: Path):
    """The lines of a UTF-8 text file as (line number from 1, text without its line end and,
    on line 1, without a byte-order mark): the reading every line-based dataset shares.

    Raises:
        DatasetError: a missing file (``path: no such file``) or a line that is not UTF-8
            (``path:line: not valid UTF-8``).
    """
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    yield from utf8_lines(path, error=DatasetError)


def tsv_header(text: str) -> tuple[str, ...] | None:
    """The columns a labelled TSV's first line names (:data:`SINGLE_COLUMNS` or
    :data:`PAIR_COLUMNS`, case and spaces ignored), or None when it is not such a header."""
    header = tuple(c.strip().lower() for c in text.split("\t"))
    return header if header in (SINGLE_COLUMNS, PAIR_COLUMNS) else None


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
    examples: list[Example] = []
    header = None
    for lineno, text in text_lines(path):
        if lineno == 1:
            header = tsv_header(text)
            if header is None:
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


def sort_labels(labels: Iterable[str]) -> list[str]:
    """Distinct labels sorted, numerically when every label is an integer ("2" before
    "10"), else as strings. Index = class id."""
    labels = set(labels)
    try:
        return sorted(labels, key=int)
    except ValueError:
        return sorted(labels)


def label_list(examples: Sequence[Example]) -> list[str]:
    """The label set of a split (:func:`sort_labels` of its labels)."""
    return sort_labels(e.label for e in examples)


def label_occurrences(examples: Sequence[Example]) -> dict[str, str]:
    """Each label of ``examples`` with where it first occurs (``path:line``), in order of
    first occurrence (the input of :func:`choose_labels`)."""
    out: dict[str, str] = {}
    for e in examples:
        out.setdefault(e.label, f"{e.path}:{e.line}")
    return out


def read_label_file(path: str | os.PathLike) -> list[str]:
    """A labels file (``--labels``): one label per line, in class-id order; surrounding
    whitespace is stripped and blank lines are skipped.

    Raises:
        DatasetError: a missing file, a line that is not UTF-8, a label given twice
            (``path:line``), or no label at all.
    """
    path = Path(path)
    labels: dict[str, int] = {}
    for lineno, text in text_lines(path):
        label = text.strip()
        if label in labels:
            raise DatasetError(f"{path}:{lineno}: label {label!r} is already on line "
                               f"{labels[label]}")
        if label:
            labels[label] = lineno
    if not labels:
        raise DatasetError(f"{path}: no label (the file is empty or only blank lines); "
                           "--labels takes one label per line")
    return list(labels)


@dataclass
class LabelSet:
    """The label set of a job (:func:`choose_labels`): ``labels`` (index = class id),
    ``source`` (``"all splits"`` or the labels file), and ``unseen``: per split other than
    train, its labels that the train split never has, each with where it first occurs
    (``path:line``); the model is never trained to predict them."""

    labels: list[str]
    source: str
    unseen: dict[str, dict[str, str]]

    def notes(self, unit: str = "label") -> list[str]:
        """One line per split with labels unseen in train (for stderr)."""
        return [f"{split}: {unit}(s) never in the train split, so never learnt: "
                + ", ".join(f"{l!r} ({where})" for l, where in found.items())
                for split, found in self.unseen.items()]

    def record(self) -> dict:
        """What ``summary.json`` keeps: ``label_source`` and ``labels_unseen_in_train``
        (split -> labels)."""
        return {"label_source": self.source,
                "labels_unseen_in_train": {k: list(v) for k, v in self.unseen.items()}}


def choose_labels(found: dict[str, dict[str, str]], order: Callable[[Iterable[str]], list[str]],
                  labels_file: str | os.PathLike | None = None, unit: str = "label"
                  ) -> LabelSet:
    """The label set of a job from the labels its splits hold.

    Without a file the set is ``order`` of the labels of all splits (so a label that only
    dev or test has still gets a class id, and scoring never stops on it); with one, the
    file's labels in its order (:func:`read_label_file`), which must cover every label
    of the data.

    Args:
        found: split name ("train", "dev", "test") -> {label: ``path:line`` of its first
            occurrence} (:func:`label_occurrences`, ``tag_occurrences``).
        order: distinct labels -> the label list (:func:`sort_labels`, ``sort_tags``).
        labels_file: the ``--labels`` file, or None.
        unit: "label" or "tag", for the messages.
    Raises:
        DatasetError: the file cannot be read (see :func:`read_label_file`), or a label of
            the data is not in it (``path:line: tag 'X' is not in --labels FILE``).
    """
    if labels_file is None:
        labels = order(l for occ in found.values() for l in occ)
        source = "all splits"
    else:
        labels, source = read_label_file(labels_file), str(labels_file)
        known = set(labels)
        for occ in found.values():
            for label, where in occ.items():
                if label not in known:
                    raise DatasetError(f"{where}: {unit} {label!r} is not in --labels "
                                       f"{labels_file} ({len(labels)} in it: "
                                       f"{' '.join(labels)})")
    train = found.get("train", {})
    unseen = {split: {l: w for l, w in occ.items() if l not in train}
              for split, occ in found.items() if split != "train"}
    return LabelSet(labels, source, {k: v for k, v in unseen.items() if v})


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
            raise DatasetError(f"{e.path}:{e.line}: unknown label {e.label!r}; the labels "
                               f"are {list(labels)}")
        out[i] = index[e.label]
    return out


@dataclass
class EncodedSplit:
    """Token ids of one split, unpadded: ``input_ids`` / ``token_type_ids`` lists of int
    lists (lengths <= max_seq_length); ``labels``: None, an int64 array with one row per
    example ((N,) class ids; (N, 2) answer start/end token positions), or one int list per
    example as long as its ``input_ids`` (token classification, -100 = not scored)."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    labels: np.ndarray | list[list[int]] | None
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
class FinetuningBatch:
    """One padded batch: input_ids, token_type_ids, attention_mask (B, T) int64 with T the
    longest row of this batch (dynamic padding), labels int64 or None ((B,) class ids,
    (B, 2) answer positions or (B, T) token labels with -100 on padding, as the split's
    labels), index (B,) positions of the rows in their split."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    labels: np.ndarray | None
    index: np.ndarray

    def to(self, xp) -> "FinetuningBatch":
        """The same batch with its arrays on ``xp``'s device (numpy: unchanged)."""
        if xp is np:
            return self
        return FinetuningBatch(*(xp.asarray(a) if a is not None else None for a in
                       (self.input_ids, self.token_type_ids, self.attention_mask,
                        self.labels)), self.index)


def pad_batch(split: EncodedSplit, index: Sequence[int], pad_id: int = 0) -> FinetuningBatch:
    """Pad the rows ``index`` of ``split`` to their longest length (right padding with
    ``pad_id``, token type 0, attention 0; per-token labels with -100)."""
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
    if split.labels is None:
        labels = None
    elif isinstance(split.labels, np.ndarray):
        labels = split.labels[index]
    else:                                           # per-token labels: (B, T), -100 padded
        labels = np.full((B, T), -100, dtype=np.int64)
        for r, i in enumerate(index):
            labels[r, :len(split.labels[i])] = split.labels[i]
    return FinetuningBatch(ids, tt, mask, labels, index)


def length_batches(split: EncodedSplit, batch_size: int, pad_id: int = 0):
    """Every row of ``split`` once, as padded :class:`FinetuningBatch` es of ``batch_size`` rows
    taken in order of length (shortest first, ties in split order), so that a batch holds
    rows of similar length and little padding; ``batch.index`` says which rows."""
    order = np.argsort(np.fromiter(map(len, split.input_ids), dtype=np.int64,
                                   count=len(split)), kind="stable")
    for i in range(0, len(order), batch_size):
        yield pad_batch(split, order[i:i + batch_size], pad_id)


def length_grouped_batches(lengths: np.ndarray, batch_size: int,
                           rng: np.random.Generator | None,
                           mega_batch_mult: int | None = None) -> list[np.ndarray]:
    """Split rows into batches of similar length, in a random batch order.

    Hugging Face transformers' ``LengthGroupedSampler`` / ``get_length_grouped_indices``
    (``Trainer(group_by_length=True)``): a random permutation of the rows is cut into
    mega-batches of ``mega_batch_mult * batch_size`` rows, each mega-batch is sorted by
    length, longest first, and cut into batches, so a batch holds rows of nearly equal
    length while which rows meet in a mega-batch stays random. Two differences from HF:
    the full batches are then shuffled (HF keeps them in descending length within each
    mega-batch), and the batch holding the longest row is swapped to the front (HF moves
    the longest row into the first batch, to hit an out-of-memory error at once; so do
    we, without unsorting a mega-batch). The one short batch, if ``batch_size`` does not
    divide the rows, stays last, as in the unsorted order.

    Args:
        lengths: (N,) tokens per row.
        batch_size: rows per batch (>= 1).
        rng: draws the permutation and the batch order; None: rows in order, no shuffle
            (evaluation), mega-batches still sorted.
        mega_batch_mult: batches per mega-batch; None: HF's default,
            ``min(N // (4 * batch_size), 50)`` and at least 1 (at least four mega-batches
            on a small split, so sorting does not undo the shuffle).
    Returns:
        the batches: int64 row-index arrays, every row exactly once.
    Raises:
        ValueError: batch_size or mega_batch_mult < 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    lengths = np.asarray(lengths)
    n = len(lengths)
    if mega_batch_mult is None:
        mega_batch_mult = max(min(n // (4 * batch_size), 50), 1)
    if mega_batch_mult < 1:
        raise ValueError(f"mega_batch_mult must be >= 1, got {mega_batch_mult}")
    order = rng.permutation(n) if rng is not None else np.arange(n)
    mega = mega_batch_mult * batch_size
    for s in range(0, n, mega):                     # sort each mega-batch, longest first
        chunk = order[s:s + mega]                   # (stable: ties keep the shuffled order)
        order[s:s + mega] = chunk[np.argsort(-lengths[chunk], kind="stable")]
    batches = [order[s:s + batch_size] for s in range(0, n, batch_size)]
    full = len(batches) - (n % batch_size != 0)     # the short batch, if any, stays last
    if rng is not None:
        batches[:full] = [batches[i] for i in rng.permutation(full)]
    if full:                                        # the longest row's batch first
        first = int(np.argmax([lengths[b[0]] for b in batches[:full]]))
        batches[0], batches[first] = batches[first], batches[0]
    return batches


def iterate_batches(split: EncodedSplit, batch_size: int, pad_id: int = 0, *,
                    seed: int | None = None, epoch: int = 0, start_batch: int = 0,
                    group_by_length: bool = False) -> Iterator[FinetuningBatch]:
    """Padded batches of ``batch_size`` rows (the last may be smaller) from batch
    ``start_batch`` on, each padded to its own longest row (:func:`pad_batch`).

    The order is drawn from (seed, epoch) only, so an epoch can be resumed at any batch:
    ``start_batch=k`` yields exactly the batches after the first k of the full epoch.

    Args:
        seed: None: the rows in split order; else a random permutation per (seed, epoch).
        group_by_length: batches of rows of similar length (:func:`length_grouped_batches`,
            HF's ``group_by_length``), in a random batch order per (seed, epoch): on the
            8,452 movie-review train rows at batch 32, 2.5% of B x T is padding instead
            of 48%; every row still comes exactly once per epoch.
    """
    rng = np.random.default_rng([seed, epoch]) if seed is not None else None
    if group_by_length:
        lengths = np.fromiter(map(len, split.input_ids), dtype=np.int64, count=len(split))
        batches = length_grouped_batches(lengths, batch_size, rng)
    else:
        order = rng.permutation(len(split)) if rng is not None else np.arange(len(split))
        batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    for index in batches[start_batch:]:
        yield pad_batch(split, index, pad_id)


__all__ = ["DatasetError", "Example", "read_tsv", "sort_labels", "label_list",
           "label_occurrences", "read_label_file", "LabelSet", "choose_labels", "label_ids", "EncodedSplit",
           "encode_split", "FinetuningBatch", "pad_batch", "length_batches",
           "length_grouped_batches",
           "iterate_batches"]
