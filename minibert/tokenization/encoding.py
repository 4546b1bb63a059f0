"""What ``BertTokenizer.__call__`` returns: a dict of model inputs that also knows each token's word.

Like transformers' ``BatchEncoding`` for fast tokenizers: the dict holds the arrays
(``input_ids``, ``token_type_ids``, ``attention_mask``, and as asked ``offset_mapping``,
``overflow_to_sample_mapping`` ...), and :meth:`BatchEncoding.word_ids` /
:meth:`BatchEncoding.sequence_ids` give, per token of one row, the word it came from and
the sequence (0 = first text, 1 = second) it belongs to, ``None`` for [CLS], [SEP] and
padding.
"""

from __future__ import annotations

__all__ = ["BatchEncoding"]


class BatchEncoding(dict):
    """A ``dict`` of model inputs plus per-row word and sequence indices.

    Args:
        data: the dict's content.
        word_ids: per row, one entry per token: the word index (int) or ``None``.
        sequence_ids: per row, one entry per token: 0, 1 or ``None``.
        batched: whether the dict's values have a leading row axis; if not, there is one
            row and ``word_ids()`` / ``sequence_ids()`` take ``batch_index=0`` only.

    Compares equal to a plain dict with the same content (the indices are not part of
    the comparison).
    """

    def __init__(
        self,
        data: dict,
        word_ids: list[list[int | None]] | None = None,
        sequence_ids: list[list[int | None]] | None = None,
        batched: bool = True,
    ):
        super().__init__(data)
        self._word_ids = word_ids
        self._sequence_ids = sequence_ids
        self.is_batched = batched

    def _row(self, table, batch_index: int, what: str) -> list[int | None]:
        if table is None:
            raise ValueError(f"{what}() is not available: this encoding was built from token ids, not text")
        if not isinstance(batch_index, int) or not -len(table) <= batch_index < len(table):
            raise IndexError(f"batch_index {batch_index!r} out of range for {len(table)} row(s)")
        return list(table[batch_index])

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        """Word index of each token of row ``batch_index`` (length T), ``None`` for special
        tokens and padding.

        A word is a basic-tokenizer word of its own sequence (each sequence of a pair counts
        from 0; each punctuation character, CJK ideograph and special token in the text is
        a word), or with ``is_split_into_words=True`` the position of the input word.
        Same as transformers' ``BatchEncoding.word_ids`` (fast tokenizers).

        Raises:
            IndexError: no such row. ValueError: the input was token ids, not text.
        """
        return self._row(self._word_ids, batch_index, "word_ids")

    def sequence_ids(self, batch_index: int = 0) -> list[int | None]:
        """0 / 1 for each token of row ``batch_index`` from the first / second sequence,
        ``None`` for special tokens and padding (transformers' ``BatchEncoding.sequence_ids``).

        Raises:
            IndexError: no such row.
        """
        return self._row(self._sequence_ids, batch_index, "sequence_ids")

    def __repr__(self) -> str:
        return f"BatchEncoding({dict.__repr__(self)})"
