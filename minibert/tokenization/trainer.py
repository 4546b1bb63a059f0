"""Learning a WordPiece vocabulary from raw text.

google-research/bert never published its vocabulary learner, so this follows the
description of the WordPiece model in Schuster & Nakajima (2012), "Japanese and Korean
Voice Search", ICASSP, section 3.1: start from the characters, and repeatedly add the
combination of two current units "that increases the likelihood on the training data
the most when added to the model".

1. Split the corpus into words exactly as :class:`BasicTokenizer` will at tokenization
   time (same cleaning, CJK splitting, lower-casing, accent stripping, punctuation
   splitting), and count the words.
2. The alphabet: every character whose corpus count reaches ``min_frequency``, spelled
   ``c`` where it starts a word and ``##c`` where it continues one (only the forms that
   occur). Characters below ``min_frequency`` are dropped, and so are the words that
   contain them (those words become ``[UNK]``); both are listed in the report and logged,
   never dropped silently. CJK ideographs are single-character words, so each one is in
   the alphabet as it is.
3. Every word starts as its characters (``h ##u ##g``). Repeatedly merge the adjacent
   pair of symbols with the best score into one symbol (``##u`` + ``##g`` -> ``##ug``),
   until the vocabulary has ``vocab_size`` tokens or no pair occurs ``min_frequency``
   times:

   - ``algorithm="wordpiece"`` (default): score = the exact increase of the training-data
     log-likelihood under a unigram language model over the current units, the
     criterion of Schuster & Nakajima. With unit counts ``c_t`` and ``n = sum c_t``,
     ``L = sum_t c_t log(c_t / n)``; merging the ``m`` occurrences of a b turns
     ``c_a, c_b`` into ``c_a - m, c_b - m`` (``c_a - 2m`` when a == b), adds ``m`` to the
     unit ab and makes ``n`` into ``n - m``. The score is that ``dL``, computed exactly
     (:func:`likelihood_gain` has the derivation). The segmentation of the corpus is the
     one the merges produce (the pair's occurrences are replaced, nothing is
     re-segmented), and a unit is a string (two pairs that spell the same string add to
     the same unit). For ``m`` small against ``c_a``, ``c_b`` and ``n``,
     ``dL ~ m (log(m n / (c_a c_b)) - 1)``: the pointwise mutual information of a and b,
     weighted by how often the merge applies.
   - ``algorithm="wordpiece-ratio"``: score = count(ab) / (count(a) * count(b)), the
     form given in the Hugging Face course's WordPiece chapter
     (https://huggingface.co/learn/llm-course/chapter6/6). It ranks by the PMI alone,
     without the factor ``m``, so a pair of two rare symbols seen twice can outrank any
     frequent pair: at a 30k vocabulary on English it spends the vocabulary on long
     rare words spelled one character at a time (see ``bench/bench_tokenizer.py``).
   - ``algorithm="bpe"``: score = count(ab), which is what Hugging Face ``tokenizers``'
     ``WordPieceTrainer`` really does (byte-pair encoding with ``##`` prefixes).

   Ties go to the pair with the higher count, then to the pair whose symbols were created
   first (smaller ids), so the result does not depend on the order of the input lines.

Speed: the corpus is reduced to a table of distinct words with counts, and the merge
loop keeps pair counts, symbol counts and, for every pair, the set of words it occurs in.
A merge rewrites only the words that contain the pair and updates the counts by
difference; the best pair comes from a heap with lazy invalidation (an entry is checked
against the live counts when it is popped and pushed again if it is stale). Scores that
a merge can raise are pushed again right away (pairs sharing a symbol with the merged
pair, pairs containing the new symbol, and for ``wordpiece`` the pairs spelling the new
unit); scores that a merge lowers (for ``wordpiece``, every gain falls a little as ``n``
shrinks) are corrected when popped. The selection is exact, not approximate: a test
compares it with a naive trainer that recounts everything before every merge.
"""

from __future__ import annotations

import heapq
import logging
import os
from math import log as _log
from math import log1p as _log1p
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from tqdm.auto import tqdm

from ..textfiles import decode_utf8
from .basic import BasicTokenizer
from .vocab import SPECIAL_TOKENS, check_writable, write_vocab

__all__ = ["TrainedVocab", "TrainingReport", "train_wordpiece", "likelihood_gain", "ALGORITHMS"]

logger = logging.getLogger(__name__)

ALGORITHMS = ("wordpiece", "wordpiece-ratio", "bpe")

_CHUNK_BYTES = 1 << 20  # read files in ~1 MiB blocks of whole lines


@dataclass
class TrainingReport:
    """What :func:`train_wordpiece` saw and did (counts are in words / characters).

    Attributes:
        algorithm: ``"wordpiece"``, ``"wordpiece-ratio"`` or ``"bpe"``.
        sources: file names read, or ``"<iterator>"``.
        n_words: word occurrences after basic tokenization.
        n_distinct_words: distinct words.
        alphabet_size: single-character tokens (``c`` and ``##c`` forms) in the vocab.
        dropped_chars: character -> corpus count, for characters below ``min_frequency``.
        n_words_with_dropped_chars: distinct words left out of training because they hold a
            dropped character (they tokenize to ``[UNK]``).
        n_long_words: distinct words longer than ``max_input_chars_per_word``, left out
            (they tokenize to ``[UNK]`` anyway).
        n_merges: merges performed (each adds one token, except when two different pairs
            spell the same string).
        vocab_size: tokens in the result.
        stopped_early: the merges ran out before ``vocab_size`` was reached.
        seconds: wall time, counting included.
    """

    algorithm: str = "wordpiece"
    sources: list[str] = field(default_factory=list)
    n_words: int = 0
    n_distinct_words: int = 0
    alphabet_size: int = 0
    dropped_chars: dict[str, int] = field(default_factory=dict)
    n_words_with_dropped_chars: int = 0
    n_long_words: int = 0
    n_merges: int = 0
    vocab_size: int = 0
    stopped_early: bool = False
    seconds: float = 0.0

    def summary(self) -> str:
        """A few human-readable lines."""
        lines = [
            f"algorithm={self.algorithm} vocab_size={self.vocab_size} merges={self.n_merges} "
            f"alphabet={self.alphabet_size} time={self.seconds:.1f}s",
            f"words: {self.n_words:,} ({self.n_distinct_words:,} distinct) from {', '.join(self.sources)}",
        ]
        if self.dropped_chars:
            shown = ", ".join(f"{c!r}x{n}" for c, n in sorted(self.dropped_chars.items(), key=lambda kv: (-kv[1], kv[0]))[:20])
            lines.append(
                f"dropped {len(self.dropped_chars)} characters below min_frequency ({shown}"
                f"{', ...' if len(self.dropped_chars) > 20 else ''}); "
                f"{self.n_words_with_dropped_chars:,} distinct words holding them will tokenize to [UNK]"
            )
        if self.n_long_words:
            lines.append(f"{self.n_long_words:,} distinct words longer than max_input_chars_per_word left out")
        if self.stopped_early:
            lines.append("stopped early: no pair left with count >= min_frequency")
        return "\n".join(lines)


class TrainedVocab(list):
    """The learned vocabulary: a ``list`` of tokens (id = index) with a ``.report``."""

    report: TrainingReport


# ---------------------------------------------------------------------------- input
def _resolve_sources(files_or_iterator) -> tuple[list[Path] | None, Iterable[str] | None]:
    """-> (files, None) or (None, iterator of lines). Raises on missing files."""
    if isinstance(files_or_iterator, (str, os.PathLike)):
        files_or_iterator = [files_or_iterator]
    if isinstance(files_or_iterator, (list, tuple)):
        files = []
        for f in files_or_iterator:
            if not isinstance(f, (str, os.PathLike)):
                raise TypeError(f"files must be paths (str or os.PathLike), got {type(f).__name__}: {f!r}")
            p = Path(f)
            if not p.is_file():
                raise FileNotFoundError(
                    f"training file not found: {str(p)!r} (a list is read as file names; "
                    f"pass iter(lines) to train on in-memory text)"
                )
            files.append(p)
        if not files:
            raise ValueError("files_or_iterator: expected at least one file, got an empty list")
        return files, None
    try:
        return None, iter(files_or_iterator)
    except TypeError:
        raise TypeError(
            f"files_or_iterator must be a path, a list of paths or an iterable of str lines; "
            f"got {type(files_or_iterator).__name__}"
        ) from None


def _count_words(files, lines, basic: BasicTokenizer, show_progress: bool) -> Counter:
    """Count the basic-tokenized words of the corpus."""
    raw: Counter = Counter()  # whitespace-separated (pre-lower-casing) words
    if files is not None:
        total = sum(p.stat().st_size for p in files)
        with tqdm(total=total, unit="B", unit_scale=True, desc="counting words", disable=not show_progress) as bar:
            for p in files:
                with open(p, "rb") as f:
                    first_line = 1
                    while True:
                        block = f.readlines(_CHUNK_BYTES)
                        if not block:
                            break
                        data = b"".join(block)
                        raw.update(basic.pre_split(decode_utf8(data, p, first_line=first_line)))
                        first_line += len(block)
                        bar.update(len(data))
    else:
        buf: list[str] = []
        size = 0
        with tqdm(unit=" lines", desc="counting words", disable=not show_progress) as bar:
            for i, line in enumerate(lines):
                if not isinstance(line, str):
                    raise TypeError(f"iterator item {i}: expected a str line, got {type(line).__name__}")
                buf.append(line)
                size += len(line)
                if size >= _CHUNK_BYTES:
                    raw.update(basic.pre_split("\n".join(buf)))
                    bar.update(len(buf))
                    buf, size = [], 0
            if buf:
                raw.update(basic.pre_split("\n".join(buf)))
                bar.update(len(buf))
    words: Counter = Counter()
    for w, c in raw.items():
        for t in basic.split_word(w):
            words[t] += c
    return words


# ---------------------------------------------------------------------------- training
def _check_settings(algorithm: str, vocab_size, min_frequency, special_tokens: list) -> None:
    """Raises ValueError for an unknown algorithm, a vocab_size that is not a positive int,
    a min_frequency that is not an int >= 0, or special tokens that repeat or hold
    whitespace."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(map(repr, ALGORITHMS))}, got {algorithm!r}")
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if not isinstance(min_frequency, int) or min_frequency < 0:
        raise ValueError(f"min_frequency must be an int >= 0, got {min_frequency!r}")
    if len(set(special_tokens)) != len(special_tokens):
        raise ValueError(f"special_tokens must be distinct, got {special_tokens}")
    for s in special_tokens:
        if not isinstance(s, str) or not s or s != s.strip() or len(s.split()) != 1:
            raise ValueError(f"special token {s!r} must be a non-empty str without whitespace")


def _alphabet(word_counts: Counter, min_frequency: int, max_chars: int,
              report: TrainingReport) -> tuple[list[str], dict[str, int]]:
    """The initial symbols: the characters that start a word, then ``##`` + those that
    continue one, each sorted, leaving out characters seen fewer than ``min_frequency``
    times (at least once) and words longer than ``max_chars``. Returns (alphabet, the
    dropped characters -> count); fills ``report.n_long_words`` and ``dropped_chars``."""
    char_counts: Counter = Counter()
    heads: set[str] = set()
    tails: set[str] = set()
    long_words = 0
    for w, c in word_counts.items():
        if len(w) > max_chars:
            long_words += 1
            continue
        heads.add(w[0])
        tails.update(w[1:])
        for ch in w:
            char_counts[ch] += c
    report.n_long_words = long_words
    min_char = max(min_frequency, 1)
    dropped = {ch: n for ch, n in char_counts.items() if n < min_char}
    report.dropped_chars = dropped
    alphabet = sorted(ch for ch in heads if ch not in dropped) + sorted(
        "##" + ch for ch in tails if ch not in dropped
    )
    return alphabet, dropped


def _spell_words(word_counts: Counter, sym_id: dict[str, int], dropped: dict[str, int],
                 max_chars: int, min_frequency: int,
                 report: TrainingReport) -> tuple[list[list[int]], list[int]]:
    """Each word the merges learn from as a list of alphabet symbol ids (its first
    character, then ``##`` + each next one), with its count; words longer than
    ``max_chars`` or holding a dropped character are left out (the latter counted in
    ``report.n_words_with_dropped_chars`` and logged)."""
    words: list[list[int]] = []
    freqs: list[int] = []
    n_bad = 0
    for w, c in word_counts.items():
        if len(w) > max_chars:
            continue
        if dropped and any(ch in dropped for ch in w):
            n_bad += 1
            continue
        words.append([sym_id[w[0]]] + [sym_id["##" + ch] for ch in w[1:]])
        freqs.append(c)
    report.n_words_with_dropped_chars = n_bad
    if dropped:
        logger.warning(
            "train_wordpiece: %d characters occur fewer than min_frequency=%d times and are left out "
            "of the vocabulary (%d distinct words holding them will tokenize to [UNK]): %s",
            len(dropped), max(min_frequency, 1), n_bad, "".join(sorted(dropped))[:200],
        )
    return words, freqs


def train_wordpiece(
    files_or_iterator, vocab_size: int, min_frequency: int = 2,
    special_tokens: Sequence[str] = SPECIAL_TOKENS, algorithm: str = "wordpiece",
    lowercase: bool = True, strip_accents: bool | None = None,
    tokenize_chinese_chars: bool = True, max_input_chars_per_word: int = 100,
    output: str | os.PathLike | None = None, show_progress: bool = True,
) -> TrainedVocab:
    """Learn a WordPiece vocabulary of ``vocab_size`` tokens from raw text.

    Args:
        files_or_iterator: a path, a list/tuple of paths (UTF-8 text), or any other
            iterable of ``str`` lines (a generator, ``iter(list_of_lines)``, an open file).
        vocab_size: wanted number of tokens, special tokens and alphabet included.
        min_frequency: a character must occur this many times to enter the alphabet, and a
            pair this many times to be merged.
        special_tokens: tokens placed first, in this order (ids 0, 1, ...); default
            :data:`~minibert.tokenization.vocab.SPECIAL_TOKENS`.
        algorithm: ``"wordpiece"`` (default: the exact unigram log-likelihood gain of
            Schuster & Nakajima, see :func:`likelihood_gain`), ``"wordpiece-ratio"``
            (count(ab) / (count(a) count(b)), the Hugging Face course's form) or ``"bpe"``
            (raw pair count, what Hugging Face ``tokenizers`` does).
        lowercase, strip_accents, tokenize_chinese_chars: the :class:`BasicTokenizer`
            settings the vocabulary will be used with (``lowercase`` = ``do_lower_case``).
        max_input_chars_per_word: longer words are left out (they tokenize to [UNK]).
        output: if given, the vocabulary is also written there as ``vocab.txt``
            (atomically, by :func:`~minibert.tokenization.vocab.write_vocab`).
        show_progress: tqdm bars for counting and merging (on stderr).

    Returns:
        :class:`TrainedVocab`, a list of tokens (id = index) whose ``.report`` is a
        :class:`TrainingReport`. It can have fewer than ``vocab_size`` tokens if the
        merges run out (``report.stopped_early``).

    Raises:
        FileNotFoundError: a training file does not exist.
        ValueError: empty corpus, unknown algorithm, bad ``special_tokens``, a
            ``vocab_size`` smaller than special tokens + alphabet, or a training file that
            is not UTF-8 (``path:line: not valid UTF-8 ...``).
        TypeError: an iterator yields something that is not a ``str``.
        OSError: ``output`` cannot be written (checked before training, see
            :func:`~minibert.tokenization.vocab.check_writable`).
    """
    t0 = time.perf_counter()
    special_tokens = list(special_tokens)
    _check_settings(algorithm, vocab_size, min_frequency, special_tokens)
    if output is not None:
        check_writable(output)  # before the hours of counting and merging, not after
    basic = BasicTokenizer(
        do_lower_case=lowercase, strip_accents=strip_accents, tokenize_chinese_chars=tokenize_chinese_chars
    )
    word_counts, report = _count_corpus(files_or_iterator, basic, algorithm, show_progress)
    tokens = _learn_tokens(word_counts, vocab_size, min_frequency, special_tokens, algorithm,
                           max_input_chars_per_word, show_progress, report)
    vocab = _finish(TrainedVocab(tokens), vocab_size, min_frequency, report, t0)
    if output is not None:
        write_vocab(vocab, output)
    return vocab


def _count_corpus(files_or_iterator, basic: BasicTokenizer, algorithm: str,
                  show_progress: bool) -> tuple[Counter, TrainingReport]:
    """The basic-tokenized word counts of the corpus and a report of its sources and
    sizes. Raises ValueError for a corpus without words (and as :func:`_resolve_sources`)."""
    files, lines = _resolve_sources(files_or_iterator)
    sources = [str(p) for p in files] if files is not None else ["<iterator>"]
    word_counts = _count_words(files, lines, basic, show_progress)
    if not word_counts:
        raise ValueError(f"empty corpus: no words in {', '.join(sources)} (expected non-blank UTF-8 text)")
    report = TrainingReport(algorithm=algorithm, sources=sources)
    report.n_words = sum(word_counts.values())
    report.n_distinct_words = len(word_counts)
    return word_counts, report


def _learn_tokens(word_counts: Counter, vocab_size: int, min_frequency: int,
                  special_tokens: list[str], algorithm: str, max_input_chars_per_word: int,
                  show_progress: bool, report: TrainingReport) -> list[str]:
    """The vocabulary in id order: the special tokens, the alphabet, then the merged
    tokens in merge order, at most ``vocab_size`` in all (``word_counts`` is consumed).

    Raises:
        ValueError: ``vocab_size`` below the special tokens plus the alphabet.
    """
    alphabet, dropped = _alphabet(word_counts, min_frequency, max_input_chars_per_word, report)
    taken = set(special_tokens)
    # A character that is also a special token stays a symbol of the words that hold it,
    # but enters the vocabulary once, as the special token.
    new_alphabet = [t for t in alphabet if t not in taken]
    report.alphabet_size = len(new_alphabet)
    needed = len(special_tokens) + len(new_alphabet)
    if vocab_size < needed:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: the {len(special_tokens)} special tokens and the "
            f"{len(new_alphabet)} alphabet symbols (characters seen >= min_frequency={min_frequency} times) "
            f"already need {needed}; use vocab_size >= {needed} or a higher min_frequency"
        )
    sym_str: list[str] = list(alphabet)
    sym_id: dict[str, int] = {s: i for i, s in enumerate(sym_str)}
    words, freqs = _spell_words(word_counts, sym_id, dropped, max_input_chars_per_word,
                                min_frequency, report)
    word_counts.clear()   # the spelled words replace the counts: free them before merging
    merged = _merge_loop(
        words, freqs, sym_str, sym_id, vocab_size - needed, min_frequency, algorithm, taken, show_progress, report
    )
    return special_tokens + new_alphabet + merged


def _finish(vocab: TrainedVocab, vocab_size: int, min_frequency: int, report: TrainingReport,
            t0: float) -> TrainedVocab:
    """``vocab`` with its completed ``report`` (size, early stop, seconds since ``t0``); a
    warning in the log when the merges ran out before ``vocab_size``."""
    report.vocab_size = len(vocab)
    report.stopped_early = len(vocab) < vocab_size
    report.seconds = time.perf_counter() - t0
    vocab.report = report
    if report.stopped_early:
        logger.warning(
            "train_wordpiece: stopped at %d tokens (asked %d): no pair occurs >= min_frequency=%d times",
            len(vocab), vocab_size, min_frequency,
        )
    return vocab


def likelihood_gain(c_a: int, c_b: int, c_new: int, m: int, n: int, same: bool = False) -> float:
    """Exact change of the unigram log-likelihood when ``m`` occurrences of a b become one unit.

    Before the merge the corpus is a sequence of ``n`` units with counts ``c_t`` and
    log-likelihood ``L = sum_t c_t log(c_t / n) = sum_t F(c_t) - F(n)`` with
    ``F(x) = x log x`` (``F(0) = 0``). Replacing ``m`` occurrences of the adjacent pair
    a b by the unit ab changes only four terms (a != b):
    ``c_a -> c_a - m``, ``c_b -> c_b - m``, ``c_ab -> c_new + m`` (``c_new`` = 0 unless a
    unit spelled ab already exists) and ``n -> n - m``; when a == b, ``c_a -> c_a - 2m``.
    With ``G(c, k) = F(c - k) - F(c) = (c - k) log1p(-k / c) - k log c`` (no cancellation
    for large c):

        dL = G(c_a, m) + G(c_b, m) - G(c_new + m, m) - G(n, m)       (a != b)
        dL = G(c_a, 2m)            - G(c_new + m, m) - G(n, m)       (a == b)

    ``m`` is the number of occurrences the merge replaces: the pair count when a != b,
    and for a == b the leftmost non-overlapping count (a run ``a a a`` gives one merge).

    Relation to the ratio form: for ``m`` small against ``c``, ``G(c, m) = -m (log c + 1)
    + O(m^2 / c)``, and ``-G(m, m) = m log m``, so with ``c_new = 0``
    ``dL = m (log(m n / (c_a c_b)) - 1) + O(m^2 / min(c_a, c_b))``: the pointwise mutual
    information ``log(m n / (c_a c_b))`` weighted by ``m``. The Hugging Face course's
    score ``m / (c_a c_b)`` ranks by the PMI alone (``n`` is the same for every pair), with
    no weight for how often the merge applies.
    """
    if same:
        return _g(c_a, 2 * m) - _g(c_new + m, m) - _g(n, m)
    return _gain_pair(c_a, c_b, c_new + m, m, n)


def _g(c: int, k: int) -> float:
    """F(c - k) - F(c) for F(x) = x log x, 0 < k <= c."""
    if k == c:
        return -c * _log(c)
    return (c - k) * _log1p(-k / c) - k * _log(c)


def _gain_pair(ca: int, cb: int, cn: int, m: int, n: int, log=_log, log1p=_log1p) -> float:
    """``G(ca, m) + G(cb, m) - G(cn, m) - G(n, m)`` with :func:`_g` inlined (the merge loop
    calls this millions of times; the operations are those of ``_g``, so the result is
    bit-identical to summing ``_g`` values)."""
    ga = -ca * log(ca) if m == ca else (ca - m) * log1p(-m / ca) - m * log(ca)
    gb = -cb * log(cb) if m == cb else (cb - m) * log1p(-m / cb) - m * log(cb)
    gc = -cn * log(cn) if m == cn else (cn - m) * log1p(-m / cn) - m * log(cn)
    gn = -n * log(n) if m == n else (n - m) * log1p(-m / n) - m * log(n)
    return ga + gb - gc - gn


def _self_merges(w: list[int]) -> list[tuple[int, int]]:
    """(symbol, merges) for each run of one symbol of length r >= 2 in ``w``: r // 2 merges."""
    out = []
    n = len(w)
    j = 0
    while j < n - 1:
        s = w[j]
        if w[j + 1] == s:
            r = 2
            j += 2
            while j < n and w[j] == s:
                r += 1
                j += 1
            out.append((s, r // 2))
        else:
            j += 1
    return out


def _repush_likelihood(a, b, sym_pairs, sym_count, pair_count, spell_of, touched, total, min_pair, heap, entry,
                       M=1 << 32):
    """After merging a b: push the current gain of every eligible pair containing a or b
    (their gains rose as c_a, c_b fell); drop pairs that died from ``sym_pairs``.

    The same sum as :func:`_gain_pair`, ``G(c_x, m) + G(c_y, m) - G(c_new + m, m) - G(n, m)``,
    with the terms that repeat across pairs (``G(n, m)``, ``G(c_sym, m)``,
    ``G(m, m)``) computed once per merge: same operations, so the same floats."""
    log, log1p, heappush = _log, _log1p, heapq.heappush
    n = total
    g_n: dict[int, float] = {}
    g_mm: dict[int, float] = {}
    for sym in (a, b) if a != b else (a,):
        keys = sym_pairs.get(sym)
        if not keys:
            continue
        cs = sym_count[sym]
        if cs == 0:
            del sym_pairs[sym]  # the symbol is gone: its pairs all have count 0
            continue
        g_s: dict[int, float] = {}
        dead = []
        for kk in keys:
            m = pair_count.get(kk, 0)
            if m <= 0:
                dead.append(kk)
                continue
            if m < min_pair or kk in touched:
                continue
            x, y = divmod(kk, M)
            if x == y:
                heappush(heap, entry(kk, m))
                continue
            gs = g_s.get(m)
            if gs is None:
                gs = g_s[m] = -cs * log(cs) if m == cs else (cs - m) * log1p(-m / cs) - m * log(cs)
            co = sym_count[y if x == sym else x]
            go = -co * log(co) if m == co else (co - m) * log1p(-m / co) - m * log(co)
            u = spell_of.get(kk)
            if u is None or not sym_count[u]:
                gc = g_mm.get(m)
                if gc is None:
                    gc = g_mm[m] = -m * log(m)
            else:
                cn = sym_count[u] + m
                gc = (cn - m) * log1p(-m / cn) - m * log(cn)
            gn = g_n.get(m)
            if gn is None:
                gn = g_n[m] = -n * log(n) if m == n else (n - m) * log1p(-m / n) - m * log(n)
            heappush(heap, (-(gs + go - gc - gn), -m, kk))
        keys.difference_update(dead)


class _Merger:
    """The state of the merge loop over ``words`` (symbol-id lists, updated in place, with
    their ``freqs``) and the symbol table ``sym_str`` / ``sym_id`` (extended in place). A
    pair (a, b) is keyed by the int ``a * M + b``.

    Heap invariant (what makes the lazy heap exact): every eligible pair has an entry
    whose key is <= its current key ``(-score, -count, pair)``. Popping the smallest
    entry and finding it equal to the pair's current key therefore gives the best pair
    (:meth:`pop_best`); an entry that no longer matches is replaced by the current key and
    the loop goes on. Scores that only fall need no action; every pair whose score may
    rise after a merge is pushed again (:meth:`repush`):

    - every score: pairs whose count rose (they contain the new symbol);
    - ``wordpiece`` and ``wordpiece-ratio``: pairs that contain a or b (their counts fell,
      which raises the score; pairs whose own count fell all contain a or b); for
      ``wordpiece`` in :func:`_repush_likelihood`;
    - ``wordpiece``: pairs spelling the new unit's string (its count rose, which raises
      their gain). The total ``n`` falls by one merge's worth each time, which lowers
      every gain (``-G(n, m)`` grows with n), so it needs no push.
    """

    M = 1 << 32

    def __init__(self, words: list[list[int]], freqs: list[int], sym_str: list[str],
                 sym_id: dict[str, int], min_frequency: int, algorithm: str):
        self.words, self.freqs, self.sym_str, self.sym_id = words, freqs, sym_str, sym_id
        self.likelihood = algorithm == "wordpiece"
        self.ratio = algorithm == "wordpiece-ratio"
        self.min_pair = max(min_frequency, 1)
        self._count_pairs()
        # pair key -> id of the existing unit its two symbols spell (so c_new can be > 0);
        # set when such a unit is created (split enumeration) or such a pair appears
        self.spell_of: dict[int, int] = {}
        self.heap = [self.entry(k, c) for k, c in self.pair_count.items() if c >= self.min_pair]
        heapq.heapify(self.heap)

    def _count_pairs(self) -> None:
        """Symbol counts, pair counts, the words each pair occurs in, each symbol's pairs
        (scores by symbols only) and the counts of a-a runs (likelihood only)."""
        M, words, freqs = self.M, self.words, self.freqs
        self.pair_count: dict[int, int] = {}
        self.pair_where: dict[int, set[int]] = {}
        self.sym_count: list[int] = [0] * len(self.sym_str)
        self.sym_pairs: dict[int, set[int]] = {}  # symbol -> keys of its pairs (a superset)
        self.self_count: dict[int, int] = {}  # symbol a -> leftmost non-overlapping a a count
        pair_count, pair_where, sym_count = self.pair_count, self.pair_where, self.sym_count
        for i, w in enumerate(words):
            f = freqs[i]
            for s in w:
                sym_count[s] += f
            for j in range(len(w) - 1):
                k = w[j] * M + w[j + 1]
                pair_count[k] = pair_count.get(k, 0) + f
                ws = pair_where.get(k)
                if ws is None:
                    pair_where[k] = {i}
                else:
                    ws.add(i)
            if self.likelihood:
                for s, r in _self_merges(w):
                    self.self_count[s] = self.self_count.get(s, 0) + r * f
        self.total = sum(sym_count)  # n: units in the corpus
        if self.likelihood or self.ratio:
            for k in pair_count:
                a, b = divmod(k, M)
                self.sym_pairs.setdefault(a, set()).add(k)
                self.sym_pairs.setdefault(b, set()).add(k)

    def entry(self, k: int, c: int):
        """The heap key ``(-score, -count, pair)`` of pair ``k`` with count ``c`` now."""
        a, b = divmod(k, self.M)
        sym_count = self.sym_count
        if self.likelihood:
            s_new = self.spell_of.get(k)
            c_new = 0 if s_new is None else sym_count[s_new]
            if a == b:
                return (-likelihood_gain(sym_count[a], 0, c_new, self.self_count[a], self.total,
                                         True), -c, k)
            return (-_gain_pair(sym_count[a], sym_count[b], c_new + c, c, self.total), -c, k)
        if self.ratio:
            return (-c / (sym_count[a] * sym_count[b]), -c, k)
        return (-c, -c, k)

    def pop_best(self) -> int | None:
        """The key of the best eligible pair (None when none is left)."""
        heap, pair_count = self.heap, self.pair_count
        while heap:
            top = heapq.heappop(heap)
            k = top[2]
            c = pair_count.get(k, 0)
            if c < self.min_pair:
                continue
            fresh = self.entry(k, c)
            if fresh == top:
                return k
            heapq.heappush(heap, fresh)
        return None

    def symbol(self, s: str) -> tuple[int, bool]:
        """The id of symbol ``s`` and whether it is new (then appended to the table)."""
        nid = self.sym_id.get(s)
        if nid is not None:
            return nid, False
        nid = len(self.sym_str)
        self.sym_str.append(s)
        self.sym_id[s] = nid
        self.sym_count.append(0)
        return nid, True

    def merge(self, k: int, nid: int) -> set[int]:
        """Replace pair ``k`` = (a, b) by symbol ``nid`` in every word that holds it (left to
        right, non-overlapping) and update the counts; returns the keys of the pairs that
        gained count (they contain nid)."""
        M, words, freqs = self.M, self.words, self.freqs
        pair_count, pair_where, sym_count = self.pair_count, self.pair_where, self.sym_count
        by_symbols = self.likelihood or self.ratio
        a, b = divmod(k, M)
        touched: set[int] = set()
        for i in pair_where.pop(k, ()):
            w = words[i]
            n = len(w)
            out = []
            j = 0
            m = 0
            while j < n:
                if j + 1 < n and w[j] == a and w[j + 1] == b:
                    out.append(nid)
                    j += 2
                    m += 1
                else:
                    out.append(w[j])
                    j += 1
            if not m:
                continue  # stale entry: the pair was merged away in this word already
            f = freqs[i]
            sym_count[a] -= m * f
            sym_count[b] -= m * f
            sym_count[nid] += m * f
            self.total -= m * f
            for j in range(n - 1):
                kk = w[j] * M + w[j + 1]
                cc = pair_count[kk] - f
                if cc:
                    pair_count[kk] = cc
                else:
                    del pair_count[kk]
            for j in range(len(out) - 1):
                x, y = out[j], out[j + 1]
                kk = x * M + y
                pair_count[kk] = pair_count.get(kk, 0) + f
                if x == nid or y == nid:
                    touched.add(kk)
                    ws = pair_where.get(kk)
                    if ws is None:
                        pair_where[kk] = {i}
                    else:
                        ws.add(i)
                    if by_symbols:
                        self.sym_pairs.setdefault(x, set()).add(kk)
                        self.sym_pairs.setdefault(y, set()).add(kk)
            if self.likelihood:
                self._recount_runs(w, out, f)
            words[i] = out
        pair_count.pop(k, None)
        return touched

    def _recount_runs(self, before: list[int], after: list[int], f: int) -> None:
        """Runs of one symbol change only where a, b or nid sit (words with no run at all
        are the common case and cost one pass each)."""
        self_count = self.self_count
        for x, r in _self_merges(before):
            cc = self_count[x] - r * f
            if cc:
                self_count[x] = cc
            else:
                del self_count[x]
        for x, r in _self_merges(after):
            self_count[x] = self_count.get(x, 0) + r * f

    def repush(self, a: int, b: int, s: str, nid: int, touched: set[int]) -> None:
        """After merging a b into ``nid`` (spelled ``s``): push every pair whose score may
        have risen (see the class docstring), then bound the heap's stale entries."""
        heap, pair_count, min_pair, entry = self.heap, self.pair_count, self.min_pair, self.entry
        if self.likelihood:
            _repush_likelihood(a, b, self.sym_pairs, self.sym_count, pair_count, self.spell_of,
                               touched, self.total, min_pair, heap, entry)
        elif self.ratio:
            self._repush_ratio(a, b, touched)
        if self.likelihood:
            self._update_spellings(s, nid, touched)
        for kk in touched:
            cc = pair_count.get(kk, 0)
            if cc >= min_pair:
                heapq.heappush(heap, entry(kk, cc))
        if len(heap) > 4 * len(pair_count) + 100_000:
            # drop stale entries: rebuild from the live counts (bounds memory)
            self.heap = [entry(kk, cc) for kk, cc in pair_count.items() if cc >= min_pair]
            heapq.heapify(self.heap)

    def _repush_ratio(self, a: int, b: int, touched: set[int]) -> None:
        """a and b became rarer: every pair containing them may score higher now."""
        for sym in (a, b):
            keys = self.sym_pairs.get(sym)
            if not keys:
                continue
            if self.sym_count[sym] == 0:
                del self.sym_pairs[sym]  # the symbol is gone: its pairs all have count 0
                continue
            dead = []
            for kk in keys:
                cc = self.pair_count.get(kk, 0)
                if cc <= 0:
                    dead.append(kk)
                elif cc >= self.min_pair and kk not in touched:
                    heapq.heappush(self.heap, self.entry(kk, cc))
            keys.difference_update(dead)

    def _update_spellings(self, s: str, nid: int, touched: set[int]) -> None:
        """Pairs that appeared in this merge (they contain nid) may spell a unit; the unit
        spelled ``s`` became more frequent, so pairs x y spelling ``s`` gain more now."""
        M, sym_str, sym_id, spell_of = self.M, self.sym_str, self.sym_id, self.spell_of
        for kk in touched:
            if kk not in spell_of:
                x, y = divmod(kk, M)
                u = sym_id.get(sym_str[x] + sym_str[y][2:])
                if u is not None:
                    spell_of[kk] = u
        for j in range(1, len(s)):
            x = sym_id.get(s[:j])
            y = sym_id.get("##" + s[j:])
            if x is not None and y is not None:
                kk = x * M + y
                spell_of[kk] = nid
                cc = self.pair_count.get(kk, 0)
                if cc >= self.min_pair and kk not in touched:
                    heapq.heappush(self.heap, self.entry(kk, cc))


def _merge_loop(
    words: list[list[int]],
    freqs: list[int],
    sym_str: list[str],
    sym_id: dict[str, int],
    n_new: int,
    min_frequency: int,
    algorithm: str,
    taken: set[str],
    show_progress: bool,
    report: TrainingReport,
) -> list[str]:
    """Merge the best pair (:class:`_Merger`) until ``n_new`` new tokens exist or no
    eligible pair is left; returns the new tokens in creation order (a merged string that
    is a special token in ``taken`` is a symbol but no new token). ``words`` and
    ``sym_str`` / ``sym_id`` are updated in place; ``report.n_merges`` counts the merges."""
    merger = _Merger(words, freqs, sym_str, sym_id, min_frequency, algorithm)
    new_tokens: list[str] = []
    with tqdm(total=n_new, desc=f"merging ({algorithm})", unit=" tokens", disable=not show_progress) as bar:
        while len(new_tokens) < n_new and (k := merger.pop_best()) is not None:
            a, b = divmod(k, merger.M)
            s = sym_str[a] + sym_str[b][2:]
            nid, new = merger.symbol(s)
            if new and s not in taken:
                new_tokens.append(s)
                bar.update(1)
            report.n_merges += 1
            merger.repush(a, b, s, nid, merger.merge(k, nid))
    return new_tokens
