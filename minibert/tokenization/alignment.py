"""Where each token comes from: character offsets in the original text and word indices.

For every WordPiece token of a text, :class:`Aligner` gives

- the ``(start, end)`` character span it covers in the ORIGINAL string (before cleaning,
  lower-casing, accent stripping), ``text[start:end]``;
- the index of the word it belongs to, a word being what the basic tokenizer splits
  the text into: a run of letters/digits between whitespace and punctuation, each
  punctuation character on its own, each CJK ideograph on its own, each special token
  found in the text ([SEP] ...) on its own; with pre-split input
  (``is_split_into_words``) the index of the input word instead.

The ids are exactly those of :meth:`BertTokenizer.text_to_ids` (transformers' Python
tokenizer); the spans and word indices are those of Hugging Face's fast tokenizer
(``tokenizers``: ``BertNormalizer`` + ``BertPreTokenizer`` + ``WordPiece``, read through
``Encoding.offsets`` / ``word_ids``), whose ``NormalizedString`` aligns every normalised
character with the original character it came from:

- a deleted character (control, U+0000, U+FFFD, an accent stripped) belongs to no
  token, but a token's span runs from its first to its last kept character, so a
  character deleted inside a word is inside the span (``"ab\\x00cd"`` -> ``(0, 5)``) and
  one at a word's edge is not (``"cafe\\u0301"`` -> ``cafe`` ``(0, 4)``);
- the characters one character becomes (``"İ"`` lower-cased is ``i`` + U+0307, NFD
  splits ``é`` into ``e`` + U+0301) all point back at it;
- an ``[UNK]`` token spans its whole basic token (an over-long or unsegmentable word);
  a ``##`` piece spans the characters it spells.

How: the text is cut around special tokens and cleaned as by
:class:`~minibert.tokenization.basic.BasicTokenizer` (steps 1-3), keeping for each kept
character its index in the original; then each whitespace-separated word is
normalised one character at a time (lower-case, NFD, drop ``Mn``: the per-character
alignment of ``tokenizers``) and split on punctuation. When the basic tokens this gives
have the lengths of those ``BasicTokenizer.split_word`` gives for the word (always, but
for the cases below), the i-th character of a token comes from the i-th normalised
character, and WordPiece pieces take their characters in order. The per-word result is
cached.

Where the two HF tokenizers give different tokens, ours (the Python one's) get spans of
their own; each case is in ``docs/tokenization.md``:

- accents kept (cased): the Python tokenizer NFC-composes the text, the Rust one does
  not; the characters NFC composes (``e`` + U+0301) all span the composed cluster;
- a special token spelled with a control character inside (``"[CL\x00S]"``) and a
  ``never_split`` word: one token, spanning the whole word;
- a capital sigma that ends a word: ``##ς`` here, ``##σ`` there, same spans;
- unassigned code points (deleted here, kept there) and about 760 characters newer than
  the Unicode tables of ``tokenizers`` (classified differently): tokens may differ.
"""

from __future__ import annotations

import re
import unicodedata
from typing import AbstractSet, Mapping, NamedTuple, Protocol, Sequence

import regex

from .basic import _CJK_RANGES, BasicTokenizer, _is_punct, is_control, is_whitespace
from .wordpiece import WordpieceTokenizer

__all__ = ["AlignedIds", "Aligner", "TokenizerParts"]

Span = tuple[int, int]

_DELETED = "\x00"  # what a deleted character becomes while words are found (never kept)
_CJK_CLASS = "".join(f"\\U{lo:08X}-\\U{hi:08X}" for lo, hi in _CJK_RANGES)
_WORDS_CJK = regex.compile(f"[{_CJK_CLASS}]|[^ {_CJK_CLASS}]+")
_WORDS = regex.compile("[^ ]+")
_NOT_SPACE = re.compile(r"\S+")  # the standard library's \s is str.isspace, as str.split()

# code point -> " " (a word boundary), "\x00" (deleted), absent = kept as it is
_MARK: dict[int, str] = {}
_KEPT: set[str] = set(" abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


def _mark_table(chars: set[str]) -> dict[int, str]:
    """``str.translate`` table for the characters of ``chars`` that are not kept as they are.

    Cleaning as in ``BasicTokenizer``: U+0000, U+FFFD and control characters are deleted;
    whitespace (``\\t \\n \\r`` and ``Zs``) is a boundary; so is every other character
    ``str.split()`` splits at (U+2028, U+2029; the ASCII separators are controls).
    """
    table = {}
    for c in chars:
        cp = ord(c)
        mark = _MARK.get(cp)
        if mark is None:
            if cp == 0 or cp == 0xFFFD or is_control(c):
                mark = _DELETED
            elif is_whitespace(c) or c.isspace():
                mark = " "
            else:
                _KEPT.add(c)
                continue
            _MARK[cp] = mark
        table[cp] = mark
    return table


class AlignedIds(NamedTuple):
    """Token ids of a text with, for each, its character span and word index.

    ``ids``: list of int, length T. ``offsets``: list of ``(start, end)`` int pairs,
    length T, spans of the original string (of the input word, for pre-split input).
    ``word_ids``: list of int, length T, 0-based word indices (the input word's index
    for pre-split input). ``offsets`` and ``word_ids`` are ``None`` for input given as
    ids (``BertTokenizer.__call__``), which has no text.
    """

    ids: list[int]
    offsets: list[Span] | None
    word_ids: list[int] | None


class _WordAlignment(NamedTuple):
    """The tokens of one cleaned word: ids, start / end indices into the word's characters,
    basic-token index within the word (one per token), and the number of basic tokens."""

    ids: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    subs: tuple[int, ...]
    n_words: int


class TokenizerParts(Protocol):
    """What an :class:`Aligner` reads from its tokenizer, which
    :class:`~minibert.tokenization.bert.BertTokenizer` provides: named here so that this
    module does not import the tokenizer that imports it."""

    vocab: Mapping[str, int]                   # token -> id
    unk_token_id: int
    do_basic_tokenize: bool
    wordpiece_tokenizer: WordpieceTokenizer
    _basic: BasicTokenizer                     # its cleaning, case and accent settings
    _special_re: "regex.Pattern"               # matches the special tokens kept whole
    _user_never_split: AbstractSet[str]        # basic tokens WordPiece leaves whole

    def _word_ids(self, word: str) -> Sequence[int]:
        """The ids of one whitespace-free word (its basic tokens, then WordPiece)."""


class Aligner:
    """Ids, character spans and word indices for one :class:`BertTokenizer`.

    Each ``BertTokenizer`` builds one and uses it in ``text_to_ids_with_offsets`` and
    ``__call__``; it holds a per-word cache. See the module docstring for the rules and
    their source.
    """

    max_cache_size = 1_000_000

    def __init__(self, tokenizer: TokenizerParts):
        self.tok = tokenizer
        basic = tokenizer._basic
        self._lower = basic.do_lower_case
        self._strip = basic._strip
        self._split_punc = basic.do_split_on_punc
        self._words_re = _WORDS_CJK if basic.tokenize_chinese_chars else _WORDS
        self._cache: dict[str, _WordAlignment] = {}
        self._char_cache: dict[str, str] = {}

    # ------------------------------------------------------------------ public
    def align(self, text: str | Sequence[str], is_split_into_words: bool = False) -> AlignedIds:
        """Ids (no [CLS]/[SEP]), spans and word indices of ``text``.

        Args:
            text: a ``str``; or, with ``is_split_into_words``, a list/tuple of ``str`` words
                (each tokenized on its own: its spans are relative to that word and its
                tokens' word index is the word's position in the list, as HF's
                ``is_split_into_words=True``).

        Returns:
            :class:`AlignedIds` of T tokens; ``ids`` equal
            ``tokenizer.text_to_ids(text)`` (for a list: the concatenation over its words).

        Raises:
            TypeError: ``text`` is not a ``str`` (or, pre-split, not a list/tuple of ``str``).
        """
        ids: list[int] = []
        offsets: list[Span] = []
        words: list[int] = []
        if is_split_into_words:
            if not isinstance(text, (list, tuple)):
                raise TypeError(
                    f"is_split_into_words=True needs a list of str words, got {type(text).__name__}"
                )
            for i, word in enumerate(text):
                if not isinstance(word, str):
                    raise TypeError(f"word {i} of a pre-split input must be str, got {type(word).__name__}")
                n = len(words)
                self._align_text(word, ids, offsets, words)
                words[n:] = [i] * (len(words) - n)
            return AlignedIds(ids, offsets, words)
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        self._align_text(text, ids, offsets, words)
        return AlignedIds(ids, offsets, words)

    # ------------------------------------------------------------------ text level
    def _align_text(self, text: str, ids: list[int], offsets: list[Span], words: list[int]) -> None:
        """Append the tokens of ``text`` to the three lists (words counted from 0)."""
        tok = self.tok
        word = 0
        pos = 0
        special_re = tok._special_re
        for m in special_re.finditer(text) if special_re.search(text) else ():
            if m.start() > pos:
                word = self._align_segment(text, pos, m.start(), word, ids, offsets, words)
            ids.append(tok.vocab[m.group()])
            offsets.append((m.start(), m.end()))
            words.append(word)
            word += 1
            pos = m.end()
        if pos < len(text):
            self._align_segment(text, pos, len(text), word, ids, offsets, words)

    def _align_segment(
        self, text: str, lo: int, hi: int, word: int, ids: list[int], offsets: list[Span], words: list[int]
    ) -> int:
        """Tokens of ``text[lo:hi]`` (no special token in it)."""
        seg = text[lo:hi]
        if not self.tok.do_basic_tokenize:
            return self._align_whitespace_words(seg, lo, word, ids, offsets, words)
        odd = set(seg) - _KEPT
        if odd:
            table = _mark_table(odd)
            if table:
                seg = seg.translate(table)
        rel_of = self._cache.get
        add_ids, add_offsets, add_words = ids.extend, offsets.extend, words.extend
        for m in self._words_re.finditer(seg):
            u = m.group()
            base = lo + m.start()
            if _DELETED in u:  # map the kept characters back to their positions
                pos = [base + j for j, c in enumerate(u) if c != _DELETED]
                u = u.replace(_DELETED, "")
                if not u:
                    continue
                rel = rel_of(u) or self._word_alignment(u)
                add_offsets([(pos[s], pos[e - 1] + 1) for s, e in zip(rel.starts, rel.ends)])
            else:
                rel = rel_of(u) or self._word_alignment(u)
                if len(rel.ids) == 1:
                    offsets.append((base + rel.starts[0], base + rel.ends[0]))
                else:
                    add_offsets(zip(map(base.__add__, rel.starts), map(base.__add__, rel.ends)))
            add_ids(rel.ids)
            add_words(map(word.__add__, rel.subs))
            word += rel.n_words
        return word

    def _align_whitespace_words(
        self, seg: str, lo: int, word: int, ids: list[int], offsets: list[Span], words: list[int]
    ) -> int:
        """``do_basic_tokenize=False``: words are ``str.split()`` pieces, WordPiece only."""
        wp = self.tok.wordpiece_tokenizer
        vocab, unk = self.tok.vocab, self.tok.unk_token_id
        for m in _NOT_SPACE.finditer(seg):
            w = m.group()
            base = lo + m.start()
            pieces = wp.tokenize_word(w)
            for p, (rs, re_) in zip(pieces, _piece_spans(pieces, [(j, j + 1) for j in range(len(w))])):
                ids.append(vocab.get(p, unk))
                offsets.append((base + rs, base + re_))
                words.append(word)
            word += 1
        return word

    # ------------------------------------------------------------------ word level
    def _normalised_chars(self, c: str) -> str:
        """What one character becomes: lower-cased, then NFD with ``Mn`` dropped (as switched on)."""
        out = self._char_cache.get(c)
        if out is None:
            out = c.lower() if self._lower else c
            if self._strip and not out.isascii():
                out = "".join(x for x in unicodedata.normalize("NFD", out) if unicodedata.category(x) != "Mn")
            self._char_cache[c] = out
        return out

    def _word_alignment(self, u: str) -> "_WordAlignment":
        """Tokens of a cleaned whitespace-free word ``u`` (before NFC), cached: their ids,
        start and end indices into the characters of ``u``, basic-token index within the
        word, and the number of basic tokens (words, for ``word_ids``)."""
        tok = self.tok
        w = u if u.isascii() else unicodedata.normalize("NFC", u)
        ids = tok._word_ids(w)
        basic = tok._basic.split_word(w)
        per_token = self._basic_token_chars(u, w, basic)
        starts: list[int] = []
        ends: list[int] = []
        subs: list[int] = []
        for sub, btok in enumerate(basic):
            if btok in tok._user_never_split:
                pieces: Sequence[str] = (btok,)
            else:
                pieces = tok.wordpiece_tokenizer.tokenize_word(btok)
            if per_token is None:
                spans = [(0, len(u))] * len(pieces)
            else:
                spans = _piece_spans(pieces, per_token[sub])
            for rs, re_ in spans:
                starts.append(rs)
                ends.append(re_)
                subs.append(sub)
        assert len(starts) == len(ids), (u, ids, starts)  # same pieces as BertTokenizer._word_pieces
        result = _WordAlignment(ids, tuple(starts), tuple(ends), tuple(subs), len(basic))
        if len(self._cache) >= self.max_cache_size:
            self._cache.clear()
            self._char_cache.clear()
        self._cache[u] = result
        return result

    def _basic_token_chars(self, u: str, w: str, basic: tuple[str, ...]) -> list[list[Span]] | None:
        """For each basic token of ``basic``, the span in ``u`` (start, end indices) each of
        its characters comes from; ``None`` when the per-character normalisation of ``u``
        does not give tokens of the same lengths (then every token of the word spans the
        whole word)."""
        if w in self.tok._basic.never_split:
            return None
        chars: list[Span] = []  # span in u of each normalised character of the current token
        tokens: list[list[Span]] = []
        if self._strip or u == w:
            source = [((j, j + 1), self._normalised_chars(c)) for j, c in enumerate(u)]
        else:
            source = _nfc_clusters(u, w, self._normalised_chars)
            if source is None:
                return None
        for span, norm in source:
            for x in norm:
                if x.isspace():
                    if chars:
                        tokens.append(chars)
                        chars = []
                elif self._split_punc and _is_punct(x):
                    if chars:
                        tokens.append(chars)
                        chars = []
                    tokens.append([span])
                else:
                    chars.append(span)
        if chars:
            tokens.append(chars)
        if len(tokens) != len(basic) or any(len(t) != len(b) for t, b in zip(tokens, basic)):
            return None
        return tokens


def _nfc_clusters(u: str, w: str, normalise) -> list[tuple[Span, str]] | None:
    """Accents kept: the reference lower-cases the NFC form ``w`` of ``u``. Cut ``u`` before
    every character of canonical combining class 0 and NFC each piece: a piece NFC leaves
    alone keeps one span per character; the characters of a piece NFC changes all span
    the whole piece (HF has no NFC step, so this is for our own tokens only). ``None`` if
    the pieces do not rebuild ``w``."""
    out: list[tuple[Span, str]] = []
    rebuilt = []
    start = 0
    for j in range(1, len(u) + 1):
        if j == len(u) or unicodedata.combining(u[j]) == 0:
            piece = u[start:j]
            nfc = unicodedata.normalize("NFC", piece)
            rebuilt.append(nfc)
            if nfc == piece:
                out.extend(((k, k + 1), normalise(c)) for k, c in enumerate(piece, start))
            else:
                out.append(((start, j), "".join(normalise(c) for c in nfc)))
            start = j
    if "".join(rebuilt) != w:
        return None
    return out


def _piece_spans(pieces: Sequence[str], origin: Sequence[Span]) -> list[Span]:
    """Spans of the WordPiece ``pieces`` of one basic token whose characters come from the
    spans ``origin`` (one per character, in the word): a ``##`` piece spans the characters
    it spells; one piece (the token itself or ``[UNK]``) spans the token; pieces whose
    lengths do not add up to the token's all span it."""
    whole = (origin[0][0], origin[-1][1])
    if len(pieces) == 1:
        return [whole]
    spans = []
    i = 0
    for k, p in enumerate(pieces):
        n = len(p) - 2 if k else len(p)
        if n <= 0 or i + n > len(origin):
            return [whole] * len(pieces)
        spans.append((origin[i][0], origin[i + n - 1][1]))
        i += n
    if i != len(origin):
        return [whole] * len(pieces)
    return spans
