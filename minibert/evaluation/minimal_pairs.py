"""Minimal pairs: does a model prefer the grammatical sentence of two that differ in one
place? BLiMP's protocol (Warstadt et al. 2020): a pair counts as right when the good
sentence scores higher; accuracy per paradigm (``UID``), per field (the mean of its
paradigms' accuracies) and the macro mean over paradigms; chance is 50%.

Pairs are read in BLiMP's JSON-lines format: one object per line with ``sentence_good``,
``sentence_bad``, ``UID``, ``field`` and ``linguistics_term`` (other fields ignored).
A masked LM scores a sentence by its pseudo-log-likelihood (:mod:`minibert.scoring`); the
floors score the same pairs with the same architecture's random weights and with a word
trigram (:class:`~minibert.evaluation.ngram.KneserNeyTrigram`) on the model's own
pretraining corpus.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

FIELDS = ("sentence_good", "sentence_bad", "UID", "field", "linguistics_term")


class PairsError(ValueError):
    """A pairs file that cannot be read; the message names the file, line and field."""


@dataclass
class MinimalPair:
    """One pair of a BLiMP-format file (``line``: 1-based line in ``path``)."""

    good: str
    bad: str
    uid: str
    field: str
    term: str
    line: int
    path: str = ""


def read_pairs(path: str | Path) -> list[MinimalPair]:
    """The pairs of a BLiMP-format JSON-lines file (blank lines skipped).

    Raises:
        PairsError: a missing or non-UTF-8 file, a line that is not a JSON object, a
            missing or non-string field, an empty sentence, or no pairs at all.
    """
    from ..finetuning.data import DatasetError, text_lines
    path = Path(path)
    pairs = []
    try:
        for lineno, line in text_lines(path):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise PairsError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            if not isinstance(d, dict):
                raise PairsError(f"{path}:{lineno}: expected a JSON object, got "
                                 f"{type(d).__name__}")
            for f in FIELDS:
                if not isinstance(d.get(f), str) or (f.startswith("sentence")
                                                      and not d[f].strip()):
                    what = "missing" if f not in d else f"not a non-empty string ({d[f]!r})"
                    raise PairsError(f"{path}:{lineno}: field {f!r} is {what}")
            pairs.append(MinimalPair(d["sentence_good"], d["sentence_bad"], d["UID"],
                                     d["field"], d["linguistics_term"], lineno, str(path)))
    except DatasetError as e:
        raise PairsError(str(e)) from None
    if not pairs:
        raise PairsError(f"{path}: no pairs (the file is empty)")
    return pairs


def accuracy(pairs: Sequence[MinimalPair], good: Sequence[float], bad: Sequence[float]
             ) -> dict:
    """The accuracies of one system on ``pairs`` from each pair's two scores, in percent.

    A pair is right when good > bad; a tie counts half (a system that cannot tell the two
    sentences apart, such as a unigram count on a word-order pair, is at chance there, not
    at 0 or 100: Papusoi & Nisioi 2025 trace an "unexpectedly high" frequency baseline on
    BLiMP to ties counted as right).

    Returns:
        ``{"macro", "se", "fields", "phenomena", "paradigms", "pairs"}``: the mean over
        paradigms (``UID``), its standard error, the mean of the paradigms of each
        ``field`` and of each phenomenon (``linguistics_term``), each paradigm's accuracy,
        and the number of pairs. ``se`` = sqrt(sum_p s_p^2 / n_p) / P over the P
        paradigms, s_p^2 the variance of paradigm p's per-pair outcomes (1, 0.5, 0) over
        its n_p pairs: the sampling error of the macro when the pairs of each paradigm
        are a random draw from its generator (BLiMP's are).
    """
    right = np.where(np.asarray(good) > np.asarray(bad), 1.0,
                     np.where(np.asarray(good) == np.asarray(bad), 0.5, 0.0))
    by_uid: dict[str, list[float]] = {}
    labels: dict[str, tuple[str, str]] = {}
    for p, r in zip(pairs, right):
        by_uid.setdefault(p.uid, []).append(float(r))
        labels[p.uid] = (p.field, p.term)
    uids = sorted(by_uid)
    paradigms = {u: 100.0 * float(np.mean(by_uid[u])) for u in uids}
    variance = sum(float(np.var(by_uid[u])) / len(by_uid[u]) for u in uids)

    def mean_by(which: int) -> dict[str, float]:
        groups: dict[str, list[float]] = {}
        for u in uids:
            groups.setdefault(labels[u][which], []).append(paradigms[u])
        return {g: float(np.mean(v)) for g, v in sorted(groups.items())}

    return {"macro": float(np.mean(list(paradigms.values()))),
            "se": 100.0 * variance ** 0.5 / len(uids),
            "fields": mean_by(0), "phenomena": mean_by(1),
            "paradigms": paradigms, "pairs": len(pairs)}


def score_pairs_mlm(model, tokenizer, pairs: Sequence[MinimalPair],
                    method: str = "pll-word-l2r", batch_size: int = 128) -> dict:
    """:func:`accuracy` of a masked LM by PLL (both sentences of every pair batched)."""
    from ..scoring import score_texts
    n = len(pairs)
    s = score_texts(model, tokenizer, [p.good for p in pairs] + [p.bad for p in pairs],
                    method, batch_size)
    scores = [r["score"] for r in s]
    return accuracy(pairs, scores[:n], scores[n:])


def score_pairs_lm(lm, pairs: Sequence[MinimalPair]) -> dict:
    """:func:`accuracy` of a sentence scorer with ``score(sentences) -> log-probs``."""
    return accuracy(pairs, lm.score([p.good for p in pairs]), lm.score([p.bad for p in pairs]))


def first_per_paradigm(pairs: Sequence[MinimalPair], n: int) -> list[MinimalPair]:
    """The first ``n`` pairs of every paradigm, in file order."""
    seen: dict[str, int] = {}
    out = []
    for p in pairs:
        if seen.get(p.uid, 0) < n:
            seen[p.uid] = seen.get(p.uid, 0) + 1
            out.append(p)
    return out


class PairsProbe:
    """The minimal-pair macro accuracy of a masked LM during pretraining: a fixed set of
    pairs, tokenized once here, scored by PLL-word-l2r in one batched pass per call.

    Pairs with a sentence that cannot be scored (:func:`minibert.scoring.unscorable`:
    nothing but ``[UNK]``, or more than ``max_length`` tokens) are dropped (``dropped``
    counts them), so another language's vocabulary costs no error.
    """

    def __init__(self, pairs: Sequence[MinimalPair], tokenizer, batch_size: int = 256,
                 max_length: int = 512):
        from ..scoring import encode_sentence, unscorable
        encoded = [(p, encode_sentence(tokenizer, p.good), encode_sentence(tokenizer, p.bad))
                   for p in pairs]
        kept = [e for e in encoded if not unscorable(tokenizer, e[1][0], max_length)
                and not unscorable(tokenizer, e[2][0], max_length)]
        self.pairs = [p for p, _, _ in kept]
        self.sentences = [g for _, g, _ in kept] + [b for _, _, b in kept]
        self.dropped = len(pairs) - len(self.pairs)
        self.tokenizer, self.batch_size = tokenizer, batch_size

    def __call__(self, model) -> float:
        """Macro accuracy (percent) of ``model`` (a BertForPreTraining, eval mode)."""
        from ..scoring import score_ids
        t = self.tokenizer
        s = [float(v.sum()) for v in score_ids(model, self.sentences, t.mask_token_id,
                                               t.pad_token_id, batch_size=self.batch_size)]
        n = len(self.pairs)
        return accuracy(self.pairs, s[:n], s[n:])["macro"]



def count_floors(sentences: Iterable[str]) -> dict[str, object]:
    """The two count floors fitted once on ``sentences``: ``{"unigram": add-0.1 word
    unigram, "trigram": Kneser-Ney word trigram}`` (:mod:`.ngram`), each scored with
    :func:`score_pairs_lm`."""
    from .ngram import AddKUnigram, KneserNeyTrigram
    sentences = list(sentences)
    return {"unigram": AddKUnigram(0.1).fit(sentences),
            "trigram": KneserNeyTrigram().fit(sentences)}


def probe_floors(probes: dict[str, PairsProbe], sentences: Iterable[str]) -> dict[str, float]:
    """``{NAME_unigram_acc, NAME_trigram_acc}``: the macro accuracy (percent) on each probe's
    pairs of the :func:`count_floors` counted once on ``sentences``."""
    counted = count_floors(sentences)
    return {f"{name}_{kind}_acc": score_pairs_lm(lm, probe.pairs)["macro"]
            for name, probe in probes.items() for kind, lm in counted.items()}


def table(results: dict[str, dict]) -> str:
    """A text table, one column per system: a row per field, a row per phenomenon (when
    the pairs have fewer phenomena than paradigms), the macro mean over paradigms and its
    standard error (:func:`accuracy`)."""
    names = list(results)
    first = results[names[0]]
    rows = [(f, "fields") for f in sorted({f for r in results.values() for f in r["fields"]})]
    phenomena = sorted({t for r in results.values() for t in r.get("phenomena", {})})
    if len(phenomena) < len(first["paradigms"]):
        rows += [(t, "phenomena") for t in phenomena]
    width = max(len("macro (paradigms)"), *(len(f) for f, _ in rows))
    shown = [n[-32:] for n in names]
    cols = [max(8, len(n)) for n in shown]

    def row(label: str, values) -> str:
        return f"{label:<{width}}" + "".join(f"  {v:>{c}.1f}" for v, c in zip(values, cols))

    lines = [f"{'field / phenomenon':<{width}}" + "".join(f"  {n:>{c}}"
                                                           for n, c in zip(shown, cols))]
    for label, key in rows:
        if key == "phenomena" and label == phenomena[0]:
            lines.append("")
        lines.append(row(label, [results[n][key].get(label, float("nan")) for n in names]))
    lines.append(row("macro (paradigms)", [results[n]["macro"] for n in names]))
    lines.append(row("standard error", [results[n].get("se", float("nan")) for n in names]))
    return "\n".join(lines)


__all__ = ["FIELDS", "MinimalPair", "PairsError", "PairsProbe", "accuracy",
           "first_per_paradigm", "probe_floors", "read_pairs",
           "score_pairs_lm", "score_pairs_mlm", "table"]
