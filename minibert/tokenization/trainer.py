"""Learning a WordPiece vocabulary from raw text.

google-research/bert never published its vocabulary learner, so this follows the
description of WordPiece in Schuster & Nakajima (2012), "Japanese and Korean Voice Search"
(section 3.2) and the Hugging Face course chapter on WordPiece:

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

   - ``algorithm="wordpiece"`` (default): score = count(ab) / (count(a) * count(b)), the
     increase in corpus likelihood of a unigram model when a and b become one unit
     (Schuster & Nakajima's criterion as stated in the Hugging Face course);
   - ``algorithm="bpe"``: score = count(ab), which is what Hugging Face ``tokenizers``'
     ``WordPieceTrainer`` really does (byte-pair encoding with ``##`` prefixes).

   Ties go to the pair with the higher count, then to the pair whose symbols were created
   first (smaller ids), so the result does not depend on the order of the input lines.

Speed: the corpus is reduced to a table of distinct words with counts, and the merge
loop keeps pair counts, symbol counts and, for every pair, the set of words it occurs in.
A merge rewrites only the words that contain the pair and updates the counts by
difference; the best pair comes from a heap with lazy invalidation (an entry is checked
against the live counts when it is popped and pushed again if it is stale). With the
WordPiece score a merge also raises the score of every pair that shares a symbol with
the merged pair (their denominators shrink), so those pairs are pushed again: the
selection is exact, not approximate.
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from tqdm.auto import tqdm

from .basic import BasicTokenizer
from .vocab import write_vocab

__all__ = ["TrainedVocab", "TrainingReport", "train_wordpiece", "DEFAULT_SPECIAL_TOKENS"]

logger = logging.getLogger(__name__)

DEFAULT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

_CHUNK_BYTES = 1 << 20  # read files in ~1 MiB blocks of whole lines


@dataclass
class TrainingReport:
    """What :func:`train_wordpiece` saw and did (counts are in words / characters).

    Attributes:
        algorithm: ``"wordpiece"`` or ``"bpe"``.
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
                    while True:
                        block = f.readlines(_CHUNK_BYTES)
                        if not block:
                            break
                        data = b"".join(block)
                        try:
                            text = data.decode("utf-8")
                        except UnicodeDecodeError as e:
                            raise ValueError(f"training file {str(p)!r} is not valid UTF-8: {e}") from None
                        raw.update(basic.pre_split(text))
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
def train_wordpiece(
    files_or_iterator,
    vocab_size: int,
    min_frequency: int = 2,
    special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
    algorithm: str = "wordpiece",
    lowercase: bool = True,
    strip_accents: bool | None = None,
    tokenize_chinese_chars: bool = True,
    max_input_chars_per_word: int = 100,
    output: str | os.PathLike | None = None,
    show_progress: bool = True,
) -> TrainedVocab:
    """Learn a WordPiece vocabulary of ``vocab_size`` tokens from raw text.

    Args:
        files_or_iterator: a path, a list/tuple of paths (UTF-8 text), or any other
            iterable of ``str`` lines (a generator, ``iter(list_of_lines)``, an open file).
        vocab_size: wanted number of tokens, special tokens and alphabet included.
        min_frequency: a character must occur this many times to enter the alphabet, and a
            pair this many times to be merged.
        special_tokens: tokens placed first, in this order (ids 0, 1, ...).
        algorithm: ``"wordpiece"`` (likelihood score, default) or ``"bpe"`` (raw pair count).
        lowercase, strip_accents, tokenize_chinese_chars: the :class:`BasicTokenizer`
            settings the vocabulary will be used with (``lowercase`` = ``do_lower_case``).
        max_input_chars_per_word: longer words are left out (they tokenize to [UNK]).
        output: if given, the vocabulary is also written there as ``vocab.txt``
            (atomically: temp file + ``os.replace``).
        show_progress: tqdm bars for counting and merging (on stderr).

    Returns:
        :class:`TrainedVocab`, a list of tokens (id = index) whose ``.report`` is a
        :class:`TrainingReport`. It can have fewer than ``vocab_size`` tokens if the
        merges run out (``report.stopped_early``).

    Raises:
        FileNotFoundError: a training file does not exist.
        ValueError: empty corpus, unknown algorithm, bad ``special_tokens``, or a
            ``vocab_size`` smaller than special tokens + alphabet.
        TypeError: an iterator yields something that is not a ``str``.
    """
    t0 = time.perf_counter()
    if algorithm not in ("wordpiece", "bpe"):
        raise ValueError(f"algorithm must be 'wordpiece' or 'bpe', got {algorithm!r}")
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if not isinstance(min_frequency, int) or min_frequency < 0:
        raise ValueError(f"min_frequency must be an int >= 0, got {min_frequency!r}")
    special_tokens = list(special_tokens)
    if len(set(special_tokens)) != len(special_tokens):
        raise ValueError(f"special_tokens must be distinct, got {special_tokens}")
    for s in special_tokens:
        if not isinstance(s, str) or not s or s != s.strip() or len(s.split()) != 1:
            raise ValueError(f"special token {s!r} must be a non-empty str without whitespace")

    files, lines = _resolve_sources(files_or_iterator)
    sources = [str(p) for p in files] if files is not None else ["<iterator>"]
    basic = BasicTokenizer(
        do_lower_case=lowercase, strip_accents=strip_accents, tokenize_chinese_chars=tokenize_chinese_chars
    )
    word_counts = _count_words(files, lines, basic, show_progress)
    if not word_counts:
        raise ValueError(f"empty corpus: no words in {', '.join(sources)} (expected non-blank UTF-8 text)")

    report = TrainingReport(algorithm=algorithm, sources=sources)
    report.n_words = sum(word_counts.values())
    report.n_distinct_words = len(word_counts)

    # ---- alphabet
    char_counts: Counter = Counter()
    heads: set[str] = set()
    tails: set[str] = set()
    long_words = 0
    for w, c in word_counts.items():
        if len(w) > max_input_chars_per_word:
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
    taken = set(special_tokens)
    alphabet = [t for t in alphabet if t not in taken]
    report.alphabet_size = len(alphabet)
    needed = len(special_tokens) + len(alphabet)
    if vocab_size < needed:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: the {len(special_tokens)} special tokens and the "
            f"{len(alphabet)} alphabet symbols (characters seen >= min_frequency={min_frequency} times) "
            f"already need {needed}; use vocab_size >= {needed} or a higher min_frequency"
        )

    # ---- symbols and words
    sym_str: list[str] = list(alphabet)
    sym_id: dict[str, int] = {s: i for i, s in enumerate(sym_str)}
    words: list[list[int]] = []
    freqs: list[int] = []
    n_bad = 0
    for w, c in word_counts.items():
        if len(w) > max_input_chars_per_word:
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
            len(dropped), min_char, n_bad, "".join(sorted(dropped))[:200],
        )
    del word_counts

    merged = _merge_loop(
        words, freqs, sym_str, sym_id, vocab_size - needed, min_frequency, algorithm, taken, show_progress, report
    )
    vocab = TrainedVocab(special_tokens + alphabet + merged)
    report.vocab_size = len(vocab)
    report.stopped_early = len(vocab) < vocab_size
    report.seconds = time.perf_counter() - t0
    vocab.report = report
    if report.stopped_early:
        logger.warning(
            "train_wordpiece: stopped at %d tokens (asked %d): no pair occurs >= min_frequency=%d times",
            len(vocab), vocab_size, min_frequency,
        )
    if output is not None:
        write_vocab(vocab, output)
    return vocab


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
    """Merge pairs until ``n_new`` new tokens exist; returns them in creation order.

    ``words`` (symbol-id lists) and ``sym_str`` / ``sym_id`` are updated in place.
    A pair (a, b) is keyed by the int ``a * M + b``.
    """
    M = 1 << 32
    wordpiece = algorithm == "wordpiece"
    min_pair = max(min_frequency, 1)

    pair_count: dict[int, int] = {}
    pair_where: dict[int, set[int]] = {}
    sym_count: list[int] = [0] * len(sym_str)
    sym_pairs: dict[int, set[int]] = {}  # symbol -> keys of pairs it is part of (superset)
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
    if wordpiece:
        for k in pair_count:
            a, b = divmod(k, M)
            sym_pairs.setdefault(a, set()).add(k)
            sym_pairs.setdefault(b, set()).add(k)

    def entry(k: int, c: int):
        if wordpiece:
            a, b = divmod(k, M)
            return (-c / (sym_count[a] * sym_count[b]), -c, k)
        return (-c, -c, k)

    heap = [entry(k, c) for k, c in pair_count.items() if c >= min_pair]
    heapq.heapify(heap)
    heappush, heappop = heapq.heappush, heapq.heappop

    new_tokens: list[str] = []
    with tqdm(total=n_new, desc=f"merging ({algorithm})", unit=" tokens", disable=not show_progress) as bar:
        while len(new_tokens) < n_new and heap:
            top = heappop(heap)
            k = top[2]
            c = pair_count.get(k, 0)
            if c < min_pair:
                continue
            fresh = entry(k, c)
            if fresh != top:
                heappush(heap, fresh)
                continue
            a, b = divmod(k, M)
            s = sym_str[a] + sym_str[b][2:]
            nid = sym_id.get(s)
            if nid is None:
                nid = len(sym_str)
                sym_str.append(s)
                sym_id[s] = nid
                sym_count.append(0)
                if s not in taken:
                    new_tokens.append(s)
                    bar.update(1)
            report.n_merges += 1
            touched: set[int] = set()  # pairs that gained count (they contain nid)
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
                        if wordpiece:
                            sym_pairs.setdefault(x, set()).add(kk)
                            sym_pairs.setdefault(y, set()).add(kk)
                words[i] = out
            pair_count.pop(k, None)
            if wordpiece:
                # a and b became rarer: every pair containing them scores higher now
                for sym in (a, b):
                    keys = sym_pairs.get(sym)
                    if not keys:
                        continue
                    if sym_count[sym] == 0:
                        del sym_pairs[sym]  # the symbol is gone: its pairs all have count 0
                        continue
                    dead = []
                    for kk in keys:
                        cc = pair_count.get(kk, 0)
                        if cc <= 0:
                            dead.append(kk)
                        elif cc >= min_pair and kk not in touched:
                            x, y = divmod(kk, M)
                            heappush(heap, (-cc / (sym_count[x] * sym_count[y]), -cc, kk))
                    keys.difference_update(dead)
            for kk in touched:
                cc = pair_count.get(kk, 0)
                if cc >= min_pair:
                    heappush(heap, entry(kk, cc))
            if len(heap) > 4 * len(pair_count) + 100_000:
                # drop stale entries: rebuild from the live counts (bounds memory)
                heap = [entry(kk, cc) for kk, cc in pair_count.items() if cc >= min_pair]
                heapq.heapify(heap)
    return new_tokens
