"""Extractive question answering (SQuAD v1.1): reading, features with a sliding window
over the context, answer extraction from start/end logits, and the official EM / F1.

Files: SQuAD v1.1 as JSON Lines, one question per line (the layout of Hugging Face's
``squad`` data set and of ``data/qa/en/squad_v1``)::

    {"id": "...", "title": "...", "context": "...", "question": "...",
     "answers": {"text": ["..."], "answer_start": [17]}}

or the original nested SQuAD JSON (``{"data": [{"title", "paragraphs": [{"context",
"qas": [{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}``), told apart by
content. ``answer_start`` is a character (code point) offset into ``context``.

Features follow Hugging Face ``run_qa.py`` (``prepare_train_features`` /
``prepare_validation_features``, and the HF course's version of the answer labelling):
``[CLS] question [SEP] context [SEP]``, truncation ``"only_second"`` to
``max_seq_length`` with overflowing windows that share ``doc_stride`` tokens; a window's
label is the token span of the first answer, or [CLS] (0, 0) when that answer is not
wholly inside the window. Answer extraction follows ``utils_qa.postprocess_qa_predictions``
(SQuAD v1: no null answer); EM and F1 follow the official ``evaluate-v1.1.py``.

Shape legend: F = features (windows) of a split, T = tokens of a feature.
"""
from __future__ import annotations

import json
import os
import re
import string
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..textfiles import decode_utf8
from ..tokenization import BertTokenizer
from .data import DatasetError, EncodedSplit


@dataclass
class QAExample:
    """One question: ``id``, ``title`` ("" if absent), ``context``, ``question``,
    ``answers`` (texts, possibly empty for unlabelled input), ``answer_starts`` (their
    character offsets in ``context``), ``line`` (1-based line in ``path``; for the nested
    format the line where its id first appears, 0 if not found)."""

    id: str
    title: str
    context: str
    question: str
    answers: list[str]
    answer_starts: list[int]
    line: int = 0
    path: str = ""


# --------------------------------------------------------------------------- reading
def _where(path: Path, line: int, qid: str | None = None) -> str:
    loc = f"{path}:{line}:" if line else f"{path}:"
    return f"{loc} (id {qid!r})" if qid else loc


def _string(obj: Mapping, key: str, where: str, allow_empty: bool = False) -> str:
    if key not in obj:
        raise DatasetError(f"{where} missing field {key!r}")
    v = obj[key]
    if not isinstance(v, str):
        raise DatasetError(f"{where} field {key!r} must be a string, got {type(v).__name__}")
    if not allow_empty and not v.strip():
        raise DatasetError(f"{where} field {key!r} is empty")
    return v


def _check_answers(texts, starts, context: str, where: str, require: bool
                   ) -> tuple[list[str], list[int]]:
    if not isinstance(texts, list) or not isinstance(starts, list):
        raise DatasetError(f"{where} answers must hold a list 'text' and a list "
                           f"'answer_start'")
    if len(texts) != len(starts):
        raise DatasetError(f"{where} {len(texts)} answer texts but {len(starts)} "
                           f"answer_start values")
    if require and not texts:
        raise DatasetError(f"{where} no answer (an extractive QA training or evaluation "
                           f"example needs at least one)")
    for k, (t, s) in enumerate(zip(texts, starts)):
        if not isinstance(t, str) or not t:
            raise DatasetError(f"{where} answer {k}: text must be a non-empty string, got "
                               f"{t!r}")
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise DatasetError(f"{where} answer {k}: answer_start must be an int >= 0, got "
                               f"{s!r}")
        found = context[s:s + len(t)]
        if found != t:
            raise DatasetError(f"{where} answer {k}: text {t!r} does not match the context "
                               f"at answer_start={s}, which reads {found!r}")
    return list(texts), list(starts)


def _record(obj, path: Path, line: int, require_answers: bool) -> QAExample:
    where = _where(path, line)
    if not isinstance(obj, dict):
        raise DatasetError(f"{where} expected a JSON object, got {type(obj).__name__}")
    qid = _string(obj, "id", where)
    where = _where(path, line, qid)
    title = obj.get("title", "")
    if not isinstance(title, str):
        raise DatasetError(f"{where} field 'title' must be a string")
    context = _string(obj, "context", where)
    question = _string(obj, "question", where)
    answers = obj.get("answers")
    if answers is None:
        if require_answers:
            raise DatasetError(f"{where} missing field 'answers'")
        texts, starts = [], []
    else:
        if not isinstance(answers, dict) or "text" not in answers or "answer_start" not in answers:
            raise DatasetError(f"{where} 'answers' must be an object with lists 'text' and "
                               f"'answer_start'")
        texts, starts = _check_answers(answers["text"], answers["answer_start"], context,
                                       where, require_answers)
    return QAExample(qid, title, context, question, texts, starts, line, str(path))


def _line_of(text: str, needle: str) -> int:
    pos = text.find(needle)
    return text.count("\n", 0, pos) + 1 if pos >= 0 else 0


def _nested(doc: dict, text: str, path: Path, require_answers: bool) -> list[QAExample]:
    data = doc["data"]
    if not isinstance(data, list):
        raise DatasetError(f"{path}: 'data' must be a list of articles")
    out = []
    for a, article in enumerate(data):
        where = f"{path}: data[{a}]:"
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise DatasetError(f"{where} an article must be an object with a list "
                               f"'paragraphs'")
        title = article.get("title", "")
        for p, para in enumerate(article["paragraphs"]):
            where = f"{path}: data[{a}].paragraphs[{p}]:"
            if not isinstance(para, dict) or not isinstance(para.get("qas"), list):
                raise DatasetError(f"{where} a paragraph must be an object with 'context' "
                                   f"and a list 'qas'")
            context = _string(para, "context", where)
            for q, qa in enumerate(para["qas"]):
                where = f"{path}: data[{a}].paragraphs[{p}].qas[{q}]:"
                if not isinstance(qa, dict):
                    raise DatasetError(f"{where} a question must be an object")
                qid = _string(qa, "id", where)
                line = _line_of(text, json.dumps(qid))
                where = f"{_where(path, line, qid)} data[{a}].paragraphs[{p}].qas[{q}]:"
                question = _string(qa, "question", where)
                if "answers" not in qa and require_answers:
                    raise DatasetError(f"{where} missing field 'answers'")
                answers = qa.get("answers", [])
                if not isinstance(answers, list) or not all(isinstance(x, dict) for x in answers):
                    raise DatasetError(f"{where} 'answers' must be a list of objects with "
                                       f"'text' and 'answer_start'")
                try:
                    texts = [x["text"] for x in answers]
                    starts = [x["answer_start"] for x in answers]
                except KeyError as e:
                    raise DatasetError(f"{where} an answer lacks {e.args[0]!r}") from None
                texts, starts = _check_answers(texts, starts, context, where, require_answers)
                out.append(QAExample(qid, title if isinstance(title, str) else "", context,
                                     question, texts, starts, line, str(path)))
    return out


def read_squad(path: str | os.PathLike, require_answers: bool = True) -> list[QAExample]:
    """Read SQuAD v1.1 questions from JSON Lines or nested SQuAD JSON (module docstring).

    Args:
        path: the file.
        require_answers: every question must have at least one answer (training and
            evaluation); False allows questions without ``answers`` (prediction only).
    Returns:
        the questions in file order (at least one).
    Raises:
        DatasetError: missing file, not UTF-8, malformed JSON (``path:line:column``), a
            record that is not an object, a missing or mistyped field (``id``,
            ``context``, ``question``, ``answers``), an answer whose text is not
            ``context[answer_start:answer_start + len(text)]`` (``path:line: (id ...)``),
            a question id given twice, or no question at all.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    text = decode_utf8(path.read_bytes(), path, error=DatasetError).lstrip("\ufeff")
    if not text.strip():
        raise DatasetError(f"{path}:1: no question (the file is empty)")
    examples: list[QAExample] = []
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg != "Extra data":  # "Extra data": one value per line, i.e. JSON Lines
            raise DatasetError(f"{path}:{e.lineno}:{e.colno}: malformed JSON ({e.msg})") from e
        doc = None
    if isinstance(doc, list):
        raise DatasetError(f"{path}:1: a JSON array; expected JSON Lines (one question "
                           f"object per line) or a SQuAD object with 'data'")
    if isinstance(doc, dict) and "data" in doc and "context" not in doc:
        examples = _nested(doc, text, path, require_answers)
    else:
        for lineno, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{lineno}:{e.colno}: malformed JSON ({e.msg})"
                                   ) from e
            examples.append(_record(obj, path, lineno, require_answers))
    if not examples:
        raise DatasetError(f"{path}:1: no question in the file")
    seen: dict[str, int] = {}
    for ex in examples:
        if ex.id in seen:
            raise DatasetError(f"{_where(path, ex.line, ex.id)} question id given twice "
                               f"(first on line {seen[ex.id]})")
        seen[ex.id] = ex.line
    return examples


# --------------------------------------------------------------------------- features
@dataclass
class QAFeatures(EncodedSplit):
    """Model inputs of a QA split, one row per window (feature).

    Fields beyond :class:`~minibert.finetuning.data.EncodedSplit` (``input_ids`` /
    ``token_type_ids`` unpadded rows of T <= max_seq_length tokens; ``labels`` (F, 2)
    int64 start / end token positions of the first answer, (0, 0) = [CLS] when it is not
    wholly in the window, or None when the examples have no answers):

    * ``example_index``: (F,) int64, the example of each feature (HF's
      ``overflow_to_sample_mapping``).
    * ``example_ids``: per feature, its example's id.
    * ``offsets``: per feature, a (T, 2) int64 array: the character span in the context
      of each context token, (-1, -1) for question tokens and [CLS] / [SEP] (HF sets
      them to None).
    * ``examples``: the examples encoded.
    """

    example_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    example_ids: list[str] = field(default_factory=list)
    offsets: list[np.ndarray] = field(default_factory=list)


def _cut_question(tokenizer: BertTokenizer, question: str, max_query_length: int | None) -> str:
    """The question's text up to the end of its ``max_query_length``-th token."""
    if max_query_length is None:
        return question
    spans = tokenizer.text_to_ids_with_offsets(question).offsets
    if len(spans) <= max_query_length:
        return question
    return question[:spans[max_query_length - 1][1]]


def answer_token_span(offsets: Sequence[Sequence[int]], sequence_ids: Sequence[int | None],
                      start_char: int, end_char: int) -> tuple[int, int]:
    """Token positions (start, end), inclusive, of the characters [start_char, end_char)
    in one feature; (0, 0) when they are not wholly inside the feature's context.

    The start is the last context token that starts at or before ``start_char``, the end
    the first context token that ends at or after ``end_char`` (the HF course's
    ``prepare_train_features``). ``run_qa.py`` scans the same way but does not stop the
    start scan at the context's end, so when the answer starts in the window's last
    context token it labels the final [SEP] as the start (3 of the 5,025 features of the
    shared SQuAD train sample at max_seq_length 128, stride 32; none at 384 / 128); the
    bounded scan gives that token.

    Args:
        offsets: (T, 2) character spans; sequence_ids: (T,) 0 question, 1 context, None.
    """
    ctx = [t for t, s in enumerate(sequence_ids) if s == 1]
    if not ctx:
        return 0, 0
    first, last = ctx[0], ctx[-1]
    if offsets[first][0] > start_char or offsets[last][1] < end_char:
        return 0, 0
    s = first
    while s <= last and offsets[s][0] <= start_char:
        s += 1
    e = last
    while e >= first and offsets[e][1] >= end_char:
        e -= 1
    return s - 1, e + 1


def prepare_qa_features(tokenizer: BertTokenizer, examples: Sequence[QAExample],
                        max_seq_length: int = 384, doc_stride: int = 128,
                        max_query_length: int | None = 64) -> QAFeatures:
    """``[CLS] question [SEP] context-window [SEP]`` features of SQuAD examples.

    As HF ``run_qa.py``: the question is stripped of leading whitespace, the pair is
    encoded with ``truncation="only_second"``, ``max_length=max_seq_length``,
    ``stride=doc_stride``, ``return_overflowing_tokens=True`` and
    ``return_offsets_mapping=True``, so a long context gives several windows, each
    starting ``window - doc_stride`` tokens after the one before. Labels as
    :func:`answer_token_span` for the first answer; offsets kept for context tokens only
    (``prepare_validation_features``). One difference: a question longer than
    ``max_query_length`` tokens is cut to that many (google-research/bert
    ``run_squad.py``'s ``max_query_length``), so a long question cannot leave no room for
    the context; None keeps it whole (exactly run_qa.py).

    Args:
        tokenizer: the BERT tokenizer.
        examples: from :func:`read_squad`.
        max_seq_length: tokens per feature, special tokens included.
        doc_stride: tokens two consecutive windows share; must be smaller than the
            window (``max_seq_length - 3 - question tokens``).
        max_query_length: see above.
    Returns:
        :class:`QAFeatures`, unpadded (pad with
        :func:`~minibert.finetuning.data.pad_batch` / ``iterate_batches``: labels come as
        (B, 2)).
    Raises:
        ValueError: a window too small for ``doc_stride`` or for any context token, with
            the example's id and what to change.
    """
    if not examples:
        return QAFeatures([], [], None, [])
    questions = [_cut_question(tokenizer, e.question.lstrip(), max_query_length)
                 for e in examples]
    try:
        enc = tokenizer(questions, [e.context for e in examples], truncation="only_second",
                        max_length=max_seq_length, stride=doc_stride,
                        return_overflowing_tokens=True, return_offsets_mapping=True,
                        return_attention_mask=False)
    except ValueError:
        _raise_for_example(tokenizer, examples, questions, max_seq_length, doc_stride)
        raise
    sample = enc["overflow_to_sample_mapping"]
    labels, offsets = _window_labels(enc, examples)
    return QAFeatures(enc["input_ids"], enc["token_type_ids"], labels, list(examples),
                      example_index=np.asarray(sample, dtype=np.int64),
                      example_ids=[examples[k].id for k in sample], offsets=offsets)


def _raise_for_example(tokenizer: BertTokenizer, examples: Sequence[QAExample],
                       questions: list[str], max_seq_length: int, doc_stride: int) -> None:
    """Encode the examples one at a time; the first that cannot be windowed raises a
    ValueError naming it (file and line, or id) and what to change. Returns if none fails."""
    for e, q in zip(examples, questions):
        try:
            tokenizer(q, e.context, truncation="only_second", max_length=max_seq_length,
                      stride=doc_stride, return_overflowing_tokens=True)
        except ValueError as err:
            where = _where(Path(e.path), e.line, e.id) if e.path else f"(id {e.id!r})"
            raise ValueError(f"{where} cannot make windows "
                             f"of max_seq_length={max_seq_length} with "
                             f"doc_stride={doc_stride}: {err}; raise max_seq_length, "
                             f"lower doc_stride or max_query_length") from None


def _window_labels(enc, examples: Sequence[QAExample]) -> tuple[np.ndarray | None, list]:
    """Per window of ``enc`` (one row per window, ``overflow_to_sample_mapping`` and
    ``offset_mapping`` asked): the (F, 2) int64 answer token span of its example's first
    answer (None unless every example has one), and its (T_f, 2) int64 character offsets,
    -1 outside the context."""
    sample = enc["overflow_to_sample_mapping"]
    labelled = all(e.answers for e in examples)
    labels = np.zeros((len(sample), 2), dtype=np.int64) if labelled else None
    offsets = []
    for f, k in enumerate(sample):
        seq = enc.sequence_ids(f)
        off = enc["offset_mapping"][f]
        if labels is not None:
            e = examples[k]
            start = e.answer_starts[0]
            labels[f] = answer_token_span(off, seq, start, start + len(e.answers[0]))
        o = np.asarray(off, dtype=np.int64).reshape(-1, 2)
        o[np.array([s != 1 for s in seq], dtype=bool)] = -1
        offsets.append(o)
    return labels, offsets


# --------------------------------------------------------------------------- answers
@dataclass
class QAPrediction:
    """The answer chosen for one question: ``text`` (a slice of the context; "" when no
    valid span exists), ``score`` (start logit + end logit; -inf when none),
    ``start`` / ``end`` character offsets (``context[start:end] == text``; -1 when none),
    ``feature`` (the window it came from; -1 when none)."""

    text: str
    score: float
    start: int
    end: int
    feature: int


def _top(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, largest first."""
    return np.argsort(-x, kind="stable")[:k]


def postprocess_qa_predictions(features: QAFeatures, start_logits: Sequence[np.ndarray],
                               end_logits: Sequence[np.ndarray], n_best_size: int = 20,
                               max_answer_length: int = 30) -> dict[str, QAPrediction]:
    """The best answer span of each question, over all its windows.

    As HF ``utils_qa.postprocess_qa_predictions`` (SQuAD v1): per feature, every pair of
    one of the ``n_best_size`` highest start logits and one of the ``n_best_size``
    highest end logits is a candidate, unless a position is not a context token (offset
    -1, or past the feature's tokens), the end is before the start, or the span is longer
    than ``max_answer_length`` tokens; its score is start logit + end logit and its text
    ``context[offsets[start][0]:offsets[end][1]]``. The highest score over all windows of
    the question wins. Where HF falls back to the text ``"empty"`` when no candidate is
    valid, this gives "" (score -inf).

    Args:
        features: from :func:`prepare_qa_features`.
        start_logits, end_logits: per feature (T_f,) float arrays (or a padded (F, T)
            array); positions past the feature's length are ignored.
        n_best_size: candidates per end per feature (HF default 20).
        max_answer_length: longest answer in tokens (HF default 30).
    Returns:
        {example id: :class:`QAPrediction`}, one per example of ``features.examples``.
    Raises:
        ValueError: not one logit row per feature.
    """
    F = len(features.input_ids)
    if len(start_logits) != F or len(end_logits) != F:
        raise ValueError(f"need one logit row per feature: {F} features, got "
                         f"{len(start_logits)} start and {len(end_logits)} end rows")
    best: dict[int, QAPrediction] = {}
    for f in range(F):
        off = features.offsets[f]
        T = len(off)
        s_log = np.asarray(start_logits[f], dtype=np.float64)[:T]
        e_log = np.asarray(end_logits[f], dtype=np.float64)[:T]
        starts, ends = _top(s_log, n_best_size), _top(e_log, n_best_size)
        S, E = np.meshgrid(starts, ends, indexing="ij")             # (n, n) candidate pairs
        ok = ((off[S, 0] >= 0) & (off[E, 0] >= 0) & (E >= S)
              & (E - S + 1 <= max_answer_length))
        if not ok.any():
            continue
        score = np.where(ok, s_log[S] + e_log[E], -np.inf)
        i, j = np.unravel_index(np.argmax(score), score.shape)    # first max: HF's sort order
        k = int(features.example_index[f])
        cand = float(score[i, j])
        if k not in best or cand > best[k].score:
            ex = features.examples[k]
            a, b = int(off[S[i, j], 0]), int(off[E[i, j], 1])
            best[k] = QAPrediction(ex.context[a:b], cand, a, b, f)
    return {ex.id: best.get(k, QAPrediction("", float("-inf"), -1, -1, -1))
            for k, ex in enumerate(features.examples)}


# --------------------------------------------------------------------------- metrics
_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD v1.1's answer normalisation (official ``evaluate-v1.1.py``): lower-case,
    delete ASCII punctuation (``string.punctuation``), replace the words a / an / the by
    a space, then collapse whitespace to single spaces (stripped)."""
    s = "".join(c for c in s.lower() if c not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 when the normalized strings are equal, else 0.0 (SQuAD v1.1)."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> float:
    """Bag-of-tokens F1 of the normalized, whitespace-split answers (SQuAD v1.1):
    common = multiset intersection; 0 when nothing is common (also when either side is
    empty after normalisation); else 2PR / (P + R) with P = common / predicted tokens,
    R = common / gold tokens."""
    pred = normalize_answer(prediction).split()
    gold = normalize_answer(ground_truth).split()
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    p, r = common / len(pred), common / len(gold)
    return 2 * p * r / (p + r)


def squad_metrics(references: Mapping[str, Sequence[str]] | Iterable[QAExample],
                  predictions: Mapping[str, str | QAPrediction]) -> dict:
    """Exact match and F1 of SQuAD v1.1 (official ``evaluate-v1.1.py``): per question the
    best score over its gold answers, averaged over all questions, in percent. A
    question without a prediction scores 0 and counts in the total (as the official
    script, which prints a note); predictions for unknown ids are ignored.

    Args:
        references: {id: gold answer texts} or the examples (their ``answers``).
        predictions: {id: answer text or :class:`QAPrediction`}.
    Returns:
        {"exact_match", "f1" (floats, 0-100), "n" (questions), "missing" (without a
        prediction)}.
    Raises:
        ValueError: no reference question, or one without gold answers.
    """
    if not isinstance(references, Mapping):
        references = {e.id: e.answers for e in references}
    if not references:
        raise ValueError("SQuAD metrics of no question")
    em = f1 = 0.0
    missing = 0
    for qid, golds in references.items():
        if not golds:
            raise ValueError(f"question {qid!r} has no gold answer")
        if qid not in predictions:
            missing += 1
            continue
        pred = predictions[qid]
        pred = pred.text if isinstance(pred, QAPrediction) else pred
        em += max(exact_match_score(pred, g) for g in golds)
        f1 += max(f1_score(pred, g) for g in golds)
    n = len(references)
    return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n, "n": n, "missing": missing}


__all__ = ["QAExample", "read_squad", "QAFeatures", "answer_token_span", "prepare_qa_features",
           "QAPrediction", "postprocess_qa_predictions", "normalize_answer",
           "exact_match_score", "f1_score", "squad_metrics"]
