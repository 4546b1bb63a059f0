"""WordPiece segmentation of one basic token: greedy longest-match-first.

Semantics of ``WordpieceTokenizer`` in transformers' ``tokenization_bert.py`` and
google-research/bert ``tokenization.py``: starting at the left, take the longest prefix
of the rest of the word that is in the vocabulary (spelled ``##piece`` when it does not
start the word), and repeat; if at some point no prefix is in the vocabulary, the whole
word becomes the unknown token. A word longer than ``max_input_chars_per_word``
characters is the unknown token without trying.

The only change from the reference loop is a bound: a candidate piece longer than the
longest vocabulary entry cannot match, so the search starts at that length instead of at
the end of the word. The result is the same.
"""

from __future__ import annotations

from typing import Mapping

__all__ = ["WordpieceTokenizer"]


class WordpieceTokenizer:
    """Greedy longest-match-first WordPiece tokenizer.

    Args:
        vocab: mapping (or set-like container) of the vocabulary tokens; continuation pieces
            are spelled with a ``##`` prefix.
        unk_token: what an unsegmentable word becomes.
        max_input_chars_per_word: words longer than this (in characters) become
            ``unk_token`` (100, as transformers).
    """

    def __init__(self, vocab: Mapping[str, int], unk_token: str = "[UNK]", max_input_chars_per_word: int = 100):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = int(max_input_chars_per_word)
        # longest candidate worth trying, in characters, for a word start and for a "##" piece
        self._max_head = max((len(t) for t in vocab if not t.startswith("##")), default=0)
        self._max_tail = max((len(t) - 2 for t in vocab if t.startswith("##")), default=0)

    def tokenize_word(self, word: str) -> list[str]:
        """Segment one whitespace-free word; returns its pieces or ``[unk_token]``."""
        n = len(word)
        if n > self.max_input_chars_per_word:
            return [self.unk_token]
        vocab = self.vocab
        if word in vocab:  # the common case: a whole word
            return [word]
        pieces = []
        start = 0
        max_len = self._max_head
        prefix = ""
        while start < n:
            end = min(n, start + max_len)
            while end > start:
                piece = prefix + word[start:end]
                if piece in vocab:
                    break
                end -= 1
            else:
                return [self.unk_token]
            pieces.append(piece)
            start = end
            prefix = "##"
            max_len = self._max_tail
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """Segment every whitespace-separated word of ``text`` (normally one basic token)."""
        out: list[str] = []
        for word in text.split():
            out.extend(self.tokenize_word(word))
        return out
