"""Basic (pre-WordPiece) tokenization: clean, split CJK, lower-case, strip accents, split punctuation.

Semantics follow ``BasicTokenizer`` in Hugging Face transformers' ``tokenization_bert.py``
(``tokenization_bert_legacy.py`` in transformers 5), itself a port of google-research/bert
``tokenization.py``. The steps, in order, for one piece of text:

1. clean: delete U+0000, U+FFFD and every character whose Unicode category starts with
   ``C`` (except ``\\t``, ``\\n``, ``\\r``); turn ``\\t``, ``\\n``, ``\\r`` and every ``Zs``
   character into a plain space;
2. CJK: put a space on both sides of every CJK ideograph (the ranges of
   :func:`is_cjk_codepoint`), so each one becomes a word of its own;
3. NFC-normalise the text and split it on whitespace (Python's ``str.split()``);
4. per word (unless it is in ``never_split``): lower-case (``str.lower``), strip accents
   (NFD, then drop ``Mn`` characters) and, unless the result is in ``never_split``, cut it
   before and after every punctuation character (ASCII non-alphanumerics and Unicode
   ``P*``);
5. split on whitespace once more (which also drops words that became empty).

Steps 4-5 depend on the word alone, so their result is cached per word; steps 1-3 run
on the whole text at C speed (a set difference against the characters already known to
be plain, ``str.translate``, one small ``regex`` for the CJK blocks, ``str.split``)
instead of Python loops over characters. Character classes come from the running
interpreter's ``unicodedata`` (not from ``regex``'s own, possibly newer, Unicode
tables), so results match the reference on the same interpreter exactly.
"""

from __future__ import annotations

import unicodedata
from typing import Iterable

import regex

__all__ = [
    "BasicTokenizer",
    "is_cjk_codepoint",
    "is_control",
    "is_punctuation",
    "is_whitespace",
]

# CJK Unified Ideographs blocks (and compatibility ideographs), as in google-research/bert.
# Hangul, Hiragana and Katakana are deliberately not here: those scripts separate words
# with spaces.
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def is_cjk_codepoint(cp: int) -> bool:
    """True if code point ``cp`` is a CJK ideograph that BERT splits into its own word.

    Ranges from google-research/bert ``tokenization.py`` (``_is_chinese_char``).
    """
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def is_whitespace(char: str) -> bool:
    """True for space, tab, newline, carriage return and Unicode ``Zs`` characters."""
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def is_control(char: str) -> bool:
    """True for characters of category ``C*``, except tab, newline and carriage return."""
    return char not in "\t\n\r" and unicodedata.category(char).startswith("C")


def is_punctuation(char: str) -> bool:
    """True for every ASCII non-letter/non-digit printable and every Unicode ``P*`` character.

    ``$``, ``^``, `````, ``+``, ``<`` ... are not Unicode punctuation but BERT treats the
    whole ASCII symbol range as punctuation.
    """
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


# Per-character facts, computed on first sight from ``unicodedata`` and shared by all
# instances (they depend only on the character and the interpreter's Unicode tables).
# Scanning each line with ``set(text) - _PLAIN`` keeps the common case at C speed; a
# regex character class for "category C*" would need hundreds of ranges (unassigned
# code points are C too) and is an order of magnitude slower.
_PLAIN: set[str] = set(" ")  # characters the cleaning step leaves alone
_REWRITE: dict[int, str | None] = {}  # code point -> " " (whitespace) or None (deleted)
_PUNCT: dict[str, bool] = {}
_CJK_RE = regex.compile(
    "[" + "".join(f"\\U{lo:08X}-\\U{hi:08X}" for lo, hi in _CJK_RANGES) + "]"
)


def _clean_table(chars: set[str]) -> dict[int, str | None]:
    """``str.translate`` table for the characters of ``chars`` that cleaning changes."""
    table = {}
    for c in chars:
        cp = ord(c)
        if cp in _REWRITE:
            table[cp] = _REWRITE[cp]
            continue
        if cp == 0 or cp == 0xFFFD or is_control(c):
            _REWRITE[cp] = table[cp] = None
        elif is_whitespace(c):
            _REWRITE[cp] = table[cp] = " "
        else:
            _PLAIN.add(c)
    return table


def _is_punct(c: str) -> bool:
    p = _PUNCT.get(c)
    if p is None:
        p = _PUNCT[c] = is_punctuation(c)
    return p


class BasicTokenizer:
    """Split text into basic tokens (words and punctuation) before WordPiece.

    Same behaviour as ``BasicTokenizer`` of transformers' Python BERT tokenizer (see the
    module docstring for the exact steps and their order).

    Args:
        do_lower_case: lower-case every word (``str.lower``).
        never_split: words (after cleaning and whitespace splitting) kept exactly as they
            are: not lower-cased, not accent-stripped, not split on punctuation.
        tokenize_chinese_chars: make every CJK ideograph a word of its own.
        strip_accents: ``None`` strips accents exactly when ``do_lower_case`` is true (the
            original BERT behaviour); ``True`` / ``False`` force it on / off.
        do_split_on_punc: split words on punctuation characters.

    ``tokenize`` never raises on a ``str``; it raises ``TypeError`` for anything else.
    """

    # Words seen more than this many times distinct are forgotten (the cache is cleared),
    # which bounds memory on adversarial input; natural text stays far below it.
    max_cache_size = 1_000_000

    def __init__(
        self,
        do_lower_case: bool = True,
        never_split: Iterable[str] | None = None,
        tokenize_chinese_chars: bool = True,
        strip_accents: bool | None = None,
        do_split_on_punc: bool = True,
    ):
        self.do_lower_case = bool(do_lower_case)
        self.never_split = set(never_split or ())
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.strip_accents = strip_accents
        self.do_split_on_punc = bool(do_split_on_punc)
        if do_lower_case:
            self._strip = strip_accents is not False
        else:
            self._strip = bool(strip_accents)
        self._cache: dict[str, tuple[str, ...]] = {}

    # -- text level -------------------------------------------------------------------
    def pre_split(self, text: str) -> list[str]:
        """Steps 1-3: clean, isolate CJK ideographs, NFC, split on whitespace.

        Returns the whitespace-separated words, before lower-casing and punctuation
        splitting. Raises ``TypeError`` if ``text`` is not a ``str``.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        odd = set(text) - _PLAIN
        if odd:
            table = _clean_table(odd)
            if table:
                text = text.translate(table)
        if not text.isascii():
            if self.tokenize_chinese_chars:
                text = _CJK_RE.sub(r" \g<0> ", text)
            text = unicodedata.normalize("NFC", text)
        return text.split()

    # -- word level -------------------------------------------------------------------
    def split_word(self, word: str) -> tuple[str, ...]:
        """Steps 4-5 for one whitespace-free word (cached): the basic tokens it gives.

        A word in ``never_split`` comes back unchanged, as a 1-tuple.
        """
        out = self._cache.get(word)
        if out is None:
            out = self._split_word_uncached(word, self.never_split)
            if len(self._cache) >= self.max_cache_size:
                self._cache.clear()
            self._cache[word] = out
        return out

    def _split_word_uncached(self, word: str, never_split) -> tuple[str, ...]:
        if word in never_split:
            return (word,)
        if self.do_lower_case:
            word = word.lower()
        if self._strip and not word.isascii():
            word = "".join(
                c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn"
            )
        # The reference checks never_split again before the punctuation split, so a word
        # that becomes one once normalised ("\u0301[CLS]" with accents stripped) stays whole.
        if word in never_split:
            return (word,)
        if self.do_split_on_punc:
            pieces = []
            start = 0
            for i, c in enumerate(word):
                if _is_punct(c):
                    if i > start:
                        pieces.append(word[start:i])
                    pieces.append(c)
                    start = i + 1
            if start < len(word):
                pieces.append(word[start:])
        else:
            pieces = [word]
        # lower() / NFD may in principle produce whitespace or an empty word: re-split.
        return tuple(" ".join(pieces).split())

    def tokenize(self, text: str, never_split: Iterable[str] | None = None) -> list[str]:
        """Split ``text`` into basic tokens.

        Args:
            text: any Unicode string.
            never_split: extra words to keep whole for this call only.

        Returns:
            list of str tokens; never contains whitespace or empty strings.
        """
        words = self.pre_split(text)
        if never_split:  # words kept whole for this call only: not cached
            keep = self.never_split | set(never_split)
            return [t for w in words for t in self._split_word_uncached(w, keep)]
        split_word = self.split_word
        out = []
        for w in words:
            out.extend(split_word(w))
        return out
