"""Token classification (NER, part-of-speech tagging): CoNLL-style files, tag sets,
encoding with word-piece label alignment, decoding back to one tag per word, entity and
token metrics, and a most-frequent-tag baseline.

File format (UTF-8): one ``word<TAB>tag`` line per word, a blank line between sentences
(any number of blank lines; a trailing one is optional), no header. Errors name the file
and the 1-based line.

How words become model inputs (Hugging Face ``run_ner.py``'s ``tokenize_and_align_labels``):
each sentence is tokenized as pre-split words (``is_split_into_words=True``); the first
WordPiece of a word carries the word's tag, the other pieces of the word, [CLS], [SEP] and
padding carry -100 (not scored by the loss). With ``label_all_tokens`` every piece carries
the word's tag, a ``B-X`` turned into ``I-X`` on the continuation pieces when ``I-X`` is a
tag (run_ner.py's ``b_to_i_label``).

Sentences longer than one input: a sentence whose pieces do not fit in
``max_seq_length - 2`` is cut into several rows (windows) at word boundaries, each word in
exactly one window, no overlap; every word still gets a prediction, and decoding joins
the windows again. A window loses the context on the other side of its cut. The number of
such sentences is returned (:attr:`TaggedSplit.n_windowed`) for the job to print. A single
word with more pieces than a window holds keeps its first ``max_seq_length - 2`` pieces
(its first piece carries its tag, so it is still predicted). A word that yields no piece
at all (only characters BERT's cleaning deletes) cannot be predicted: decoding gives it
``fill_tag`` and :attr:`TaggedSplit.n_words_without_pieces` counts it.

Entity metrics follow seqeval's default mode (conlleval-compatible, lenient chunking),
token accuracy as seqeval's ``accuracy_score``; both written here and checked against
seqeval in tests/test_tagging.py.

Shape legend: R = rows (windows) of a split, T = tokens of a row, K = tags.
"""
from __future__ import annotations

import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Sequence

import numpy as np

from ..tokenization import BertTokenizer
from .data import DatasetError, EncodedSplit, text_lines

IGNORE_INDEX = -100
_PREFIXES = "BIES"


@dataclass
class TaggedSentence:
    """One sentence: ``words`` and ``tags`` (equal lengths, at least one word), ``line``
    the 1-based line of its first word in ``path`` (word i is on line ``line + i``)."""

    words: list[str]
    tags: list[str]
    line: int
    path: str = ""


def read_conll(path: str | os.PathLike) -> list[TaggedSentence]:
    """Read a ``word<TAB>tag`` file (see the module docstring).

    The word is kept as written (no stripping); the tag is stripped of surrounding
    whitespace; a ``\\r`` before the newline and a UTF-8 byte-order mark are ignored.

    Args:
        path: the file.
    Returns:
        the sentences in file order (at least one).
    Raises:
        DatasetError: missing file, not UTF-8, a line without a tab, with more than one
            tab, with an empty (or whitespace-only) word or tag, or no sentence at all;
            each message starts with ``path:line:``.
    """
    path = Path(path)
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    start = 0
    for lineno, text in text_lines(path):
        if not text.strip():
            if words:
                sentences.append(TaggedSentence(words, tags, start, str(path)))
                words, tags = [], []
            continue
        cols = text.split("\t")
        if len(cols) != 2:
            what = "no tab" if len(cols) == 1 else f"{len(cols) - 1} tabs"
            raise DatasetError(f"{path}:{lineno}: expected 'word<TAB>tag', got {what}: "
                               f"{text[:80]!r}")
        word, tag = cols[0], cols[1].strip()
        if not word.strip():
            raise DatasetError(f"{path}:{lineno}: empty word (before the tab)")
        if not tag:
            raise DatasetError(f"{path}:{lineno}: empty tag (after the tab)")
        if not words:
            start = lineno
        words.append(word)
        tags.append(tag)
    if words:
        sentences.append(TaggedSentence(words, tags, start, str(path)))
    if not sentences:
        raise DatasetError(f"{path}:1: no sentence (the file is empty or only blank lines)")
    return sentences


def sort_tags(tags: Iterable[str]) -> list[str]:
    """Distinct tags in class-id order: ``O`` first when it occurs, then the others sorted
    as strings."""
    tags = set(tags)
    return (["O"] if "O" in tags else []) + sorted(tags - {"O"})


def tag_list(sentences: Sequence[TaggedSentence]) -> list[str]:
    """The tag set of a split (:func:`sort_tags` of its tags). Index = class id."""
    return sort_tags(t for s in sentences for t in s.tags)


def tag_occurrences(sentences: Sequence[TaggedSentence]) -> dict[str, str]:
    """Each tag of ``sentences`` with where it first occurs (``path:line``), in order of
    first occurrence (the input of :func:`~minibert.finetuning.data.choose_labels`)."""
    out: dict[str, str] = {}
    for s in sentences:
        for i, t in enumerate(s.tags):
            if t not in out:
                out[t] = f"{s.path}:{s.line + i}"
    return out


def tag_ids(sentence: TaggedSentence, tags: Sequence[str] | dict[str, int]) -> list[int]:
    """The class ids of ``sentence.tags`` under ``tags`` (a list, or a tag -> id dict).

    Raises:
        DatasetError: a tag not in ``tags`` (``path:line: tag 'X' is not in the train
            split's tags``), naming the known ones.
    """
    index = tags if isinstance(tags, dict) else {t: i for i, t in enumerate(tags)}
    out = []
    for i, t in enumerate(sentence.tags):
        k = index.get(t)
        if k is None:
            raise DatasetError(f"{sentence.path}:{sentence.line + i}: tag {t!r} (word "
                               f"{sentence.words[i]!r}) is not in the train split's tags "
                               f"{list(index)}")
        out.append(k)
    return out


def check_tags(sentences: Sequence[TaggedSentence], tags: Sequence[str]) -> None:
    """Raise :class:`DatasetError` at the first tag of ``sentences`` (a dev or test split)
    that is not in ``tags`` (from the train split), naming file and line."""
    index = {t: i for i, t in enumerate(tags)}
    for s in sentences:
        tag_ids(s, index)


@dataclass
class TaggedSplit(EncodedSplit):
    """An encoded tagging split: one row per window (usually one per sentence).

    Fields beyond :class:`~minibert.finetuning.data.EncodedSplit` (whose ``labels`` are
    here one int list per row, as long as its ``input_ids``: tag ids and -100; or None
    when encoded without tags):

    * ``word_ids``: per row, per token, the index of its word in the sentence (not in the
      window), None for [CLS] and [SEP].
    * ``sentence_index``: (R,) int64, the sentence of each row.
    * ``sentences``: the sentences encoded.
    * ``n_windowed``: sentences cut into more than one window.
    * ``n_words_without_pieces``: words that gave no WordPiece (predicted as ``fill_tag``).
    * ``n_pieces_dropped``: pieces beyond a window inside one over-long word.
    """

    word_ids: list[list[int | None]] = field(default_factory=list)
    sentence_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    sentences: list[TaggedSentence] = field(default_factory=list)
    n_windowed: int = 0
    n_words_without_pieces: int = 0
    n_pieces_dropped: int = 0


def word_windows(word_ids: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Cut one sentence's tokens into windows of at most ``budget`` tokens at word
    boundaries.

    Args:
        word_ids: (T,) word index of each token (non-decreasing, no None).
        budget: tokens per window (``max_seq_length - 2``), >= 1.
    Returns:
        ``(start, stop)`` token ranges in order. They cover every token, except the pieces
        beyond ``budget`` of a word longer than ``budget`` (its window holds its first
        ``budget`` pieces only and the next window starts at the next word).
    """
    n = len(word_ids)
    out = []
    lo = 0
    while lo < n:
        hi = min(lo + budget, n)
        if hi < n and word_ids[hi] == word_ids[hi - 1]:      # the cut falls inside a word
            first = hi - 1
            while first > lo and word_ids[first - 1] == word_ids[hi]:
                first -= 1
            if first > lo:
                hi = first                                 # the word goes to the next window
            else:                                          # one word longer than a window
                out.append((lo, hi))
                while hi < n and word_ids[hi] == word_ids[lo]:
                    hi += 1
                lo = hi
                continue
        out.append((lo, hi))
        lo = hi
    return out


def continuation_ids(tags: Sequence[str]) -> list[int]:
    """Per tag id, the id a continuation piece gets with ``label_all_tokens``: that of
    ``I-X`` for a ``B-X`` tag when ``I-X`` is a tag, else the tag's own id (HF
    ``run_ner.py``'s ``b_to_i_label``)."""
    index = {t: i for i, t in enumerate(tags)}
    return [index.get("I-" + t[2:], i) if t.startswith("B-") else i for i, t in enumerate(tags)]


def encode_tagging(tokenizer: BertTokenizer, sentences: Sequence[TaggedSentence],
                   max_seq_length: int, tags: Sequence[str] | None = None,
                   label_all_tokens: bool = False) -> TaggedSplit:
    """Tokenize pre-split sentences and align their tags with the word pieces.

    ``[CLS] pieces [SEP]`` per window (see the module docstring); a sentence that fits is
    exactly ``tokenizer(words, is_split_into_words=True)``, and its labels those of HF
    ``run_ner.py`` (``label_all_tokens`` as there).

    Args:
        tokenizer: the BERT tokenizer.
        sentences: from :func:`read_conll`.
        max_seq_length: tokens per row, [CLS] and [SEP] included (>= 3).
        tags: the tag set (index = class id); None: no labels (prediction only).
        label_all_tokens: label every piece of a word, not only its first.
    Returns:
        :class:`TaggedSplit` with unpadded rows; ``labels[r][t]`` int in [0, K) or -100.
    Raises:
        DatasetError: a tag not in ``tags`` (file and line).
        ValueError: ``max_seq_length`` < 3.
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3 ([CLS], one piece, [SEP]), got "
                         f"{max_seq_length}")
    budget = max_seq_length - 2
    index = {t: i for i, t in enumerate(tags)} if tags is not None else None
    cont = continuation_ids(tags) if tags is not None else None
    enc = tokenizer([s.words for s in sentences], is_split_into_words=True,
                    add_special_tokens=False, return_token_type_ids=False,
                    return_attention_mask=False) if sentences else {"input_ids": []}
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids_out, types_out, labels_out, words_out, sent_out = [], [], [], [], []
    n_windowed = n_empty = n_dropped = 0
    for k, s in enumerate(sentences):
        ids = enc["input_ids"][k]
        wids = enc.word_ids(k)
        n_empty += len(s.words) - len(set(wids))
        if index is not None:
            y = tag_ids(s, index)
            lab, prev = [], None
            for w in wids:
                if w != prev:
                    lab.append(y[w])
                else:
                    lab.append(cont[y[w]] if label_all_tokens else IGNORE_INDEX)
                prev = w
        windows = word_windows(wids, budget)
        n_windowed += len(windows) > 1
        n_dropped += len(ids) - sum(hi - lo for lo, hi in windows)
        for lo, hi in windows or [(0, 0)]:
            ids_out.append([cls, *ids[lo:hi], sep])
            types_out.append([0] * (hi - lo + 2))
            words_out.append([None, *wids[lo:hi], None])
            sent_out.append(k)
            if index is not None:
                labels_out.append([IGNORE_INDEX, *lab[lo:hi], IGNORE_INDEX])
    return TaggedSplit(ids_out, types_out, labels_out if index is not None else None,
                       word_ids=words_out, sentence_index=np.asarray(sent_out, dtype=np.int64),
                       sentences=list(sentences), n_windowed=n_windowed,
                       n_words_without_pieces=n_empty, n_pieces_dropped=n_dropped)


def decode_tags(split: TaggedSplit, predictions: Sequence[np.ndarray], tags: Sequence[str],
                fill_tag: str | None = None) -> list[list[str]]:
    """One predicted tag per word of every sentence of ``split``: the prediction at the
    word's first piece (HF's convention), windows joined back.

    Args:
        split: from :func:`encode_tagging`.
        predictions: one entry per row r of ``split``, either (T_r,) int class ids or
            (T_r, K) logits / probabilities (argmax taken); T_r may exceed the row's length
            (padding, ignored). A padded (R, T) or (R, T, K) array works too.
        tags: the tag set (index = class id).
        fill_tag: the tag of a word that has no piece (see the module docstring); None:
            ``"O"`` when it is a tag, else ``tags[0]``.
    Returns:
        per sentence, a list of tags as long as its words.
    Raises:
        ValueError: not one prediction per row, or a row's prediction shorter than it.
    """
    if len(predictions) != len(split.input_ids):
        raise ValueError(f"need one prediction per row: {len(split.input_ids)} rows, got "
                         f"{len(predictions)}")
    if fill_tag is None:
        fill_tag = "O" if "O" in tags else tags[0]
    for r, pred in enumerate(predictions):
        if np.shape(pred)[0] < len(split.word_ids[r]):
            raise ValueError(f"row {r}: {len(split.word_ids[r])} tokens but a prediction of "
                             f"length {np.shape(pred)[0]}")
    ids = [np.asarray(p) if np.ndim(p) == 1 else np.asarray(p).argmax(axis=-1)
           for p in predictions]
    return [[fill_tag if p is None else tags[int(ids[p[0]][p[1]])] for p in pieces]
            for pieces in first_pieces(split)]


def first_pieces(split: TaggedSplit) -> list[list[tuple[int, int] | None]]:
    """Where each word of every sentence of ``split`` is read: ``(row, token)`` of its
    first piece (HF's convention; a word cut across windows is read in the last window
    that holds a piece of it), or None for a word without a piece."""
    out: list[list[tuple[int, int] | None]] = [[None] * len(s.words) for s in split.sentences]
    for r, wids in enumerate(split.word_ids):
        words = out[split.sentence_index[r]]
        prev = None
        for t, w in enumerate(wids):
            if w is not None and w != prev:
                words[w] = (r, t)
            prev = w
    return out


# --------------------------------------------------------------------------- metrics
def _split_tag(tag: str) -> tuple[str, str]:
    """``'B-PER'`` -> ``('B', 'PER')``, ``'O'`` -> ``('O', '')``."""
    if tag == "O":
        return "O", ""
    if len(tag) > 2 and tag[0] in _PREFIXES and tag[1] == "-":
        return tag[0], tag[2:]
    raise ValueError(f"{tag!r} is not an entity tag: entity metrics need 'O' or B-/I-/E-/S- "
                     f"followed by a type")


def is_entity_tagset(tags: Sequence[str]) -> bool:
    """True when every tag is ``O`` or ``B-``/``I-``/``E-``/``S-`` + type (BIO, IOB1,
    IOBES), so entity metrics apply; False for e.g. part-of-speech tags."""
    try:
        for t in tags:
            _split_tag(t)
    except ValueError:
        return False
    return True


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities (chunks) of one tag sequence: ``(type, first, last)`` word indices,
    inclusive, in order.

    Lenient conlleval chunking, as seqeval's default mode: a chunk ends before a word when
    the word before it is ``E-``/``S-``, or the word is ``B-``/``S-``/``O``, or the type
    changes; a chunk starts at a non-``O`` word that is ``B-``/``S-``, or follows ``O``,
    ``E-`` or ``S-``, or changes the type. So ``I-`` after ``O`` starts an entity (IOB1,
    ill-formed BIO) and ``B-`` / ``I-`` / ``E-`` / ``S-`` schemes all read correctly.

    Raises:
        ValueError: a tag that is not ``O`` or a B/I/E/S-prefixed type.
    """
    out = []
    prev_p, prev_t = "O", ""
    begin = 0
    for i, tag in enumerate(list(tags) + ["O"]):
        p, t = _split_tag(tag)
        if prev_p != "O" and (prev_p in "ES" or p in "BSO" or prev_t != t):
            out.append((prev_t, begin, i - 1))
        if p != "O" and (p in "BS" or prev_p in "OES" or prev_t != t):
            begin = i
        prev_p, prev_t = p, t
    return out


def _prf(correct: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    p = correct / n_pred if n_pred else 0.0
    r = correct / n_gold if n_gold else 0.0
    f = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return p, r, f


def entity_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict:
    """Entity-level precision, recall and F1, micro-averaged and per type.

    An entity is correct when a predicted chunk has the same type, first and last word
    as a gold chunk (:func:`get_entities`, per sentence); P = correct / predicted,
    R = correct / gold, F1 = 2PR / (P + R), each 0 when its denominator is 0. Same numbers
    as seqeval's ``precision_score`` / ``recall_score`` / ``f1_score`` /
    ``classification_report`` in the default (non-strict) mode (conlleval's chunking).

    Args:
        gold, pred: per sentence, one tag per word (equal lengths).
    Returns:
        {"precision", "recall", "f1" (floats in [0, 1]), "n_gold", "n_pred", "n_correct"
        (ints), "per_type": {type: {"precision", "recall", "f1", "support"}}} with a row
        for every type in gold or predictions, support = gold entities of the type.
    Raises:
        ValueError: different numbers of sentences or words, or a non-entity tag.
    """
    _check_aligned(gold, pred)
    n_gold: Counter = Counter()
    n_pred: Counter = Counter()
    n_ok: Counter = Counter()
    for g, p in zip(gold, pred):
        eg, ep = set(get_entities(g)), set(get_entities(p))
        n_gold.update(e[0] for e in eg)
        n_pred.update(e[0] for e in ep)
        n_ok.update(e[0] for e in eg & ep)
    per_type = {}
    for t in sorted(set(n_gold) | set(n_pred)):
        p, r, f = _prf(n_ok[t], n_pred[t], n_gold[t])
        per_type[t] = {"precision": p, "recall": r, "f1": f, "support": n_gold[t]}
    c, np_, ng = sum(n_ok.values()), sum(n_pred.values()), sum(n_gold.values())
    p, r, f = _prf(c, np_, ng)
    return {"precision": p, "recall": r, "f1": f, "n_gold": ng, "n_pred": np_,
            "n_correct": c, "per_type": per_type}


def _check_aligned(gold, pred) -> None:
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted")
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")


def token_accuracy(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """Fraction of words whose predicted tag equals the gold tag, over all sentences
    (seqeval's ``accuracy_score``; the usual part-of-speech score).

    Raises:
        ValueError: different numbers of sentences or words, or no word at all.
    """
    _check_aligned(gold, pred)
    n = sum(len(g) for g in gold)
    if n == 0:
        raise ValueError("token accuracy of no words")
    return sum(a == b for g, p in zip(gold, pred) for a, b in zip(g, p)) / n


def tagging_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]],
                    tags: Sequence[str] | None = None) -> dict:
    """``{"accuracy", "n_words"}`` always, plus :func:`entity_metrics` (``precision``,
    ``recall``, ``f1``, counts, ``per_type``) when the tags are entity tags
    (:func:`is_entity_tagset` of ``tags``, or of the gold tags when ``tags`` is None).

    Raises:
        ValueError: as :func:`token_accuracy`.
    """
    out: dict = {"accuracy": token_accuracy(gold, pred), "n_words": sum(map(len, gold))}
    if tags is None:
        tags = sorted({t for g in gold for t in g})
    if is_entity_tagset(tags) and is_entity_tagset({t for p in pred for t in p}):
        out.update(entity_metrics(gold, pred))
    return out


# --------------------------------------------------------------------------- baseline
class MostFrequentTagBaseline:
    """Tag each word with the tag it has most often in the training split (ties: the tag
    seen first), an unseen word with the most frequent tag overall. The word is matched
    as written (case-sensitive). The usual lower bound for part-of-speech tagging.
    """

    def __init__(self):
        self.by_word: dict[str, str] = {}
        self.default: str | None = None

    def fit(self, sentences: Sequence[TaggedSentence]) -> "MostFrequentTagBaseline":
        """Count (word, tag) pairs of ``sentences``; returns self.

        Raises:
            ValueError: no sentence.
        """
        if not sentences:
            raise ValueError("the most-frequent-tag baseline needs at least one sentence")
        per_word: dict[str, Counter] = {}
        overall: Counter = Counter()
        for s in sentences:
            for w, t in zip(s.words, s.tags):
                per_word.setdefault(w, Counter())[t] += 1
                overall[t] += 1
        # Counter.most_common keeps first-seen order among equal counts
        self.by_word = {w: c.most_common(1)[0][0] for w, c in per_word.items()}
        self.default = overall.most_common(1)[0][0]
        return self

    def predict(self, sentences: Sequence[TaggedSentence] | Sequence[Sequence[str]]
                ) -> list[list[str]]:
        """One tag per word of each sentence (a :class:`TaggedSentence` or a word list)."""
        if self.default is None:
            raise ValueError("fit the baseline first")
        get, d = self.by_word.get, self.default
        return [[get(w, d) for w in (s.words if isinstance(s, TaggedSentence) else s)]
                for s in sentences]

    def score(self, sentences: Sequence[TaggedSentence]) -> dict:
        """:func:`tagging_metrics` of the baseline's predictions on ``sentences``."""
        return tagging_metrics([s.tags for s in sentences], self.predict(sentences))


def warn_long_sentences(split: TaggedSplit, max_seq_length: int, what: str = "") -> str | None:
    """A one-line note about the windowed sentences, words without pieces and dropped
    pieces of ``split`` (None when there are none), also issued as a ``UserWarning``."""
    parts = []
    if split.n_windowed:
        parts.append(f"{split.n_windowed} sentence(s) longer than max_seq_length="
                     f"{max_seq_length} were cut into several windows at word boundaries "
                     f"(every word is still predicted)")
    if split.n_words_without_pieces:
        parts.append(f"{split.n_words_without_pieces} word(s) gave no WordPiece and are "
                     f"predicted as the fill tag")
    if split.n_pieces_dropped:
        parts.append(f"{split.n_pieces_dropped} piece(s) of words longer than a window were "
                     f"dropped (their first piece is kept)")
    if not parts:
        return None
    msg = (f"{what}: " if what else "") + "; ".join(parts)
    warnings.warn(msg, stacklevel=2)
    return msg


__all__ = ["IGNORE_INDEX", "TaggedSentence", "read_conll", "sort_tags", "tag_list",
           "tag_occurrences", "tag_ids",
           "check_tags", "TaggedSplit", "word_windows", "continuation_ids", "encode_tagging",
           "decode_tags", "is_entity_tagset", "get_entities", "entity_metrics",
           "token_accuracy", "tagging_metrics", "MostFrequentTagBaseline",
           "warn_long_sentences"]
