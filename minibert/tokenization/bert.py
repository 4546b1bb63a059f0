"""The full BERT tokenizer: special tokens, basic tokenization, WordPiece, ids, encode/decode.

Behaviour follows transformers' Python ``BertTokenizer`` (``BertTokenizerLegacy`` in
transformers 5, ``tokenization_bert.py`` before): the text is first cut around exact
occurrences of the special tokens ([CLS], [SEP], [PAD], [MASK], [UNK]), which pass
through untouched; every other piece goes through :class:`BasicTokenizer` and then
:class:`WordpieceTokenizer`. ``encode`` / ``__call__`` add ``[CLS] A [SEP]`` or
``[CLS] A [SEP] B [SEP]``, with the truncation and padding rules of transformers'
``PreTrainedTokenizer.prepare_for_model`` / ``truncate_sequences`` / ``pad``.

Character offsets (``offset_mapping``), ``word_ids()``, pre-split input
(``is_split_into_words``) and overflowing windows with a ``stride`` follow transformers'
fast tokenizer (the Rust ``tokenizers`` library), which the Python one does not have:
see :mod:`minibert.tokenization.alignment` and :meth:`BertTokenizer.overflow_windows`.

Speed: the result of basic + WordPiece tokenization is cached per whitespace-separated
word (as tokens and as ids), so a corpus costs a few regex passes per line plus one dict
lookup per word.

Deliberate differences from the reference, all on inputs it only logs about:
truncation that cannot reach ``max_length`` raises ``ValueError`` (the reference logs an
error and returns the over-long sequence), a special token missing from the vocab
file raises ``ValueError`` (the reference silently appends it after the vocab), and a
token on two lines of the vocab file raises :class:`~minibert.tokenization.vocab.VocabError`
(the reference keeps the last id, so ids then run past ``len(vocab)``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

import numpy as np
import regex

from .alignment import AlignedIds, Aligner
from .basic import BasicTokenizer
from .encoding import BatchEncoding
from .vocab import load_vocab, write_vocab
from .wordpiece import WordpieceTokenizer

__all__ = ["BertTokenizer"]

_TRUNCATION = {
    True: "longest_first",
    "longest_first": "longest_first",
    "only_first": "only_first",
    "only_second": "only_second",
    False: None,
    None: None,
    "do_not_truncate": None,
}
_PADDING = {
    True: "longest",
    "longest": "longest",
    "max_length": "max_length",
    False: None,
    None: None,
    "do_not_pad": None,
}

# the columns of __call__'s output besides input_ids, in their order
_OPTIONAL_COLUMNS = ("token_type_ids", "attention_mask", "special_tokens_mask", "offset_mapping")


class _Row(NamedTuple):
    """One row of ``__call__``'s output, unpadded (T tokens): ids, token types, special
    mask, offsets (or ``None``), word ids (or ``None``), sequence ids."""

    ids: list[int]
    types: list[int]
    special: list[int]
    offsets: list[tuple[int, int]] | None
    words: list[int | None] | None
    sequences: list[int | None]


def _padded_length(pad: str | None, rows, max_length: int | None,
                   pad_to_multiple_of: int | None) -> int | None:
    """The length rows are padded to: ``max_length`` (``'max_length'``), the longest row
    (``'longest'``) or None (no padding), rounded up to a multiple of
    ``pad_to_multiple_of`` when given."""
    target = None
    if pad == "max_length":
        target = max_length
    elif pad == "longest":
        target = max((len(r.ids) for r in rows), default=0)
    if target is not None and pad_to_multiple_of:
        target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
    return target


def _as_arrays(out: dict[str, list]) -> dict[str, np.ndarray]:
    """``return_tensors='np'``: each column as an int64 array (B, T) (offsets (B, T, 2)).

    Raises:
        ValueError: rows of different lengths (not padded).
    """
    widths = {len(r) for r in out["input_ids"]}
    if len(widths) > 1:
        raise ValueError(
            f"return_tensors='np' needs equal lengths, got lengths {sorted(widths)}; pass padding=True"
        )
    width = widths.pop() if widths else 0
    arrays = {}
    for k, v in out.items():
        a = np.asarray(v, dtype=np.int64)
        arrays[k] = a.reshape(len(v), width, 2) if k == "offset_mapping" else a
    return arrays


def _id_of(token_attribute: str) -> property:
    """A read-only property: the vocabulary id of the token the tokenizer holds under
    ``token_attribute`` (e.g. ``"unk_token"``)."""
    return property(lambda self: self.vocab[getattr(self, token_attribute)],
                    doc=f"The id of ``{token_attribute}`` in the vocabulary (int).")


class BertTokenizer:
    """BERT WordPiece tokenizer reading a standard ``vocab.txt``.

    Args:
        vocab_file: path of the vocabulary, one token per line (id = line number).
        do_lower_case: lower-case the text (uncased models).
        do_basic_tokenize: run :class:`BasicTokenizer` before WordPiece; if false, the
            text is only split on whitespace.
        never_split: words that are neither lower-cased nor split (basic tokenizer).
        unk_token, sep_token, pad_token, cls_token, mask_token: the special tokens; each
            must be in the vocabulary.
        tokenize_chinese_chars: every CJK ideograph is a word of its own.
        strip_accents: ``None`` = strip exactly when lower-casing (original BERT).
        max_input_chars_per_word: longer words become ``unk_token`` (100).
        clean_up_tokenization_spaces: default for ``decode``: remove the space before
            ``. , ? !`` and in English contractions, as transformers does.
        model_max_length: the longest input the model takes, in tokens (specials
            included), or None (unset). Truncation or ``padding='max_length'`` without a
            ``max_length`` use it, as transformers' ``model_max_length`` (where its
            "unset" is the sentinel ``int(1e30)``); read from ``tokenizer_config.json`` /
            ``tokenizer.json`` by :mod:`minibert.hf`.

    Raises:
        FileNotFoundError: ``vocab_file`` does not exist.
        VocabError (a ``ValueError``): the vocab file is empty, not UTF-8, or has a token on
            two lines (see :func:`~minibert.tokenization.vocab.read_vocab_tokens`).
        ValueError: the vocabulary lacks one of the special tokens, a
            ``model_max_length`` that is not a positive int or None.

    Source of the semantics: transformers ``tokenization_bert.py`` (Python tokenizer) and
    google-research/bert ``tokenization.py``.
    """

    def __init__(
        self,
        vocab_file: str | os.PathLike,
        do_lower_case: bool = True,
        do_basic_tokenize: bool = True,
        never_split: Iterable[str] | None = None,
        unk_token: str = "[UNK]",
        sep_token: str = "[SEP]",
        pad_token: str = "[PAD]",
        cls_token: str = "[CLS]",
        mask_token: str = "[MASK]",
        tokenize_chinese_chars: bool = True,
        strip_accents: bool | None = None,
        max_input_chars_per_word: int = 100,
        clean_up_tokenization_spaces: bool = True,
        model_max_length: int | None = None,
    ):
        if model_max_length is not None and (isinstance(model_max_length, bool) or not isinstance(
                model_max_length, (int, np.integer)) or model_max_length < 1):
            raise ValueError(f"model_max_length must be a positive int or None, got "
                             f"{model_max_length!r}")
        self.model_max_length = None if model_max_length is None else int(model_max_length)
        self.vocab_file = str(vocab_file)
        self.vocab: dict[str, int] = load_vocab(vocab_file)
        self.ids_to_tokens: dict[int, str] = {i: t for t, i in self.vocab.items()}
        self.do_lower_case = bool(do_lower_case)
        self.do_basic_tokenize = bool(do_basic_tokenize)
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        self.unk_token, self.sep_token, self.pad_token = unk_token, sep_token, pad_token
        self.cls_token, self.mask_token = cls_token, mask_token
        for field in ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
            if (tok := getattr(self, field)) not in self.vocab:
                raise ValueError(
                    f"{field}={tok!r} is not in the vocab file {self.vocab_file!r} "
                    f"({len(self.vocab)} tokens); every special token must have a line in it"
                )
        # As in the reference, the special tokens are never split by the basic tokenizer
        # (this matters only for a special token that appears once the text is cleaned,
        # e.g. "[CL\x00S]"), while only the user's ``never_split`` words skip WordPiece.
        # ``basic_tokenizer`` is the public one (user's never_split only, as the
        # reference's attribute); ``_basic`` is the one used inside ``tokenize``.
        self._user_never_split = frozenset(never_split or ())
        basic_kw = dict(
            do_lower_case=do_lower_case, tokenize_chinese_chars=tokenize_chinese_chars, strip_accents=strip_accents
        )
        self.basic_tokenizer = BasicTokenizer(never_split=self._user_never_split, **basic_kw)
        self._basic = BasicTokenizer(never_split=self._user_never_split | set(self.all_special_tokens), **basic_kw)
        self.wordpiece_tokenizer = WordpieceTokenizer(self.vocab, unk_token, max_input_chars_per_word)
        # longest first, so that one special token that is a prefix of another loses
        specials = sorted(set(self.all_special_tokens), key=lambda s: (-len(s), s))
        self._special_re = regex.compile("|".join(regex.escape(s) for s in specials))
        self._special_set = frozenset(specials)
        self._special_ids = frozenset(self.vocab[s] for s in specials)
        self._word_cache: dict[str, tuple[str, ...]] = {}
        self._id_cache: dict[str, tuple[int, ...]] = {}
        self._aligner = Aligner(self)  # offsets and word ids (alignment.py), its own per-word cache

    # ------------------------------------------------------------------ basic facts
    @property
    def all_special_tokens(self) -> list[str]:
        """The five special tokens: unk, sep, pad, cls, mask (the reference's order)."""
        return [self.unk_token, self.sep_token, self.pad_token, self.cls_token, self.mask_token]

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of :attr:`all_special_tokens`, in the same order."""
        return [self.vocab[t] for t in self.all_special_tokens]

    # the id of each special token: unk_token_id, sep_token_id ... (transformers' names)
    unk_token_id = _id_of("unk_token")
    sep_token_id = _id_of("sep_token")
    pad_token_id = _id_of("pad_token")
    cls_token_id = _id_of("cls_token")
    mask_token_id = _id_of("mask_token")

    @property
    def vocab_size(self) -> int:
        """Number of distinct tokens in the vocabulary."""
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def get_vocab(self) -> dict[str, int]:
        """A copy of the token -> id dict."""
        return dict(self.vocab)

    def __repr__(self) -> str:
        return (
            f"BertTokenizer(vocab_file={self.vocab_file!r}, vocab_size={len(self.vocab)}, "
            f"do_lower_case={self.do_lower_case})"
        )

    # ------------------------------------------------------------------ tokenizing
    def _word_pieces(self, word: str) -> tuple[str, ...]:
        """Basic split + WordPiece of one whitespace-free word, cached."""
        pieces = self._word_cache.get(word)
        if pieces is None:
            bt = self._basic
            out: list[str] = []
            for tok in bt.split_word(word):
                if tok in self._user_never_split:
                    out.append(tok)
                else:
                    out.extend(self.wordpiece_tokenizer.tokenize_word(tok))
            pieces = tuple(out)
            if len(self._word_cache) >= BasicTokenizer.max_cache_size:
                self._word_cache.clear()
                self._id_cache.clear()
            self._word_cache[word] = pieces
        return pieces

    def _word_ids(self, word: str) -> tuple[int, ...]:
        ids = self._id_cache.get(word)
        if ids is None:
            unk = self.vocab[self.unk_token]
            ids = tuple(self.vocab.get(p, unk) for p in self._word_pieces(word))
            self._id_cache[word] = ids
        return ids

    def _segments(self, text: str) -> list[tuple[bool, str]]:
        """Cut ``text`` around special tokens: [(is_special, piece), ...]."""
        out = []
        pos = 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                out.append((False, text[pos : m.start()]))
            out.append((True, m.group()))
            pos = m.end()
        if pos < len(text):
            out.append((False, text[pos:]))
        return out

    def _pre_split(self, text: str) -> list[str]:
        if self.do_basic_tokenize:
            return self._basic.pre_split(text)
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        return text.split()

    def tokenize(self, text: str) -> list[str]:
        """Split ``text`` into WordPiece tokens (str), special tokens kept whole.

        Raises ``TypeError`` if ``text`` is not a ``str``; never raises on a ``str``.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        out: list[str] = []
        if self.do_basic_tokenize:
            pieces = self._word_pieces
        else:
            pieces = lambda w: self.wordpiece_tokenizer.tokenize_word(w)  # noqa: E731
        cache = self._word_cache if self.do_basic_tokenize else {}
        segments = self._segments(text) if self._special_re.search(text) else ((False, text),)
        for special, seg in segments:
            if special:
                out.append(seg)
                continue
            for w in self._pre_split(seg):
                p = cache.get(w)
                out.extend(pieces(w) if p is None else p)
        return out

    def text_to_ids(self, text: str) -> list[int]:
        """``convert_tokens_to_ids(tokenize(text))``, faster (ids cached per word); no [CLS]/[SEP]."""
        if not self.do_basic_tokenize:
            return self.convert_tokens_to_ids(self.tokenize(text))
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        out: list[int] = []
        word_ids = self._word_ids
        cache = self._id_cache
        segments = self._segments(text) if self._special_re.search(text) else ((False, text),)
        for special, seg in segments:
            if special:
                out.append(self.vocab[seg])
                continue
            for w in self._basic.pre_split(seg):
                p = cache.get(w)
                out.extend(word_ids(w) if p is None else p)
        return out

    def text_to_ids_with_offsets(self, text: str | Sequence[str], is_split_into_words: bool = False) -> AlignedIds:
        """:meth:`text_to_ids` plus, per token, its character span and its word index.

        Args:
            text: a str; or with ``is_split_into_words=True`` a list/tuple of str words.

        Returns:
            :class:`~minibert.tokenization.alignment.AlignedIds` ``(ids, offsets, word_ids)``,
            three lists of length T (no [CLS]/[SEP]): ids as :meth:`text_to_ids` (for a word
            list: the concatenation over its words); ``offsets[t] = (start, end)`` with
            ``text[start:end]`` the original characters of token t (for a word list:
            relative to its word); ``word_ids[t]`` the 0-based word index (for a word list:
            the word's position). Spans and word indices are those of transformers' fast
            ``BertTokenizer`` (``tokenizers``' ``Encoding.offsets`` / ``word_ids``); see
            :mod:`minibert.tokenization.alignment` for the rules.

        Raises:
            TypeError: ``text`` is not a str (not a list/tuple of str when pre-split).
        """
        return self._aligner.align(text, is_split_into_words=is_split_into_words)

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        """Token(s) -> id(s); a token not in the vocab maps to ``unk_token_id``."""
        unk = self.vocab[self.unk_token]
        if isinstance(tokens, str):
            return self.vocab.get(tokens, unk)
        get = self.vocab.get
        return [get(t, unk) for t in tokens]

    def convert_ids_to_tokens(
        self, ids: int | Sequence[int], skip_special_tokens: bool = False
    ) -> str | list[str]:
        """Id(s) -> token(s); an id outside the vocab maps to ``unk_token``."""
        if isinstance(ids, (int, np.integer)):
            return self.ids_to_tokens.get(int(ids), self.unk_token)
        special = self._special_ids if skip_special_tokens else ()
        get = self.ids_to_tokens.get
        unk = self.unk_token
        return [get(int(i), unk) for i in ids if int(i) not in special]

    # ------------------------------------------------------------------ model inputs
    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        """2 for ``[CLS] A [SEP]``, 3 for ``[CLS] A [SEP] B [SEP]``."""
        return 3 if pair else 2

    def build_inputs_with_special_tokens(self, ids_a: list[int], ids_b: list[int] | None = None) -> list[int]:
        """``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` (ids)."""
        cls, sep = self.cls_token_id, self.sep_token_id
        if ids_b is None:
            return [cls, *ids_a, sep]
        return [cls, *ids_a, sep, *ids_b, sep]

    def create_token_type_ids_from_sequences(self, ids_a: list[int], ids_b: list[int] | None = None) -> list[int]:
        """Segment ids for :meth:`build_inputs_with_special_tokens`: 0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``."""
        first = [0] * (len(ids_a) + 2)
        return first if ids_b is None else first + [1] * (len(ids_b) + 1)

    def get_special_tokens_mask(self, ids_a: list[int], ids_b: list[int] | None = None) -> list[int]:
        """1 where :meth:`build_inputs_with_special_tokens` puts a special token, else 0."""
        if ids_b is None:
            return [1] + [0] * len(ids_a) + [1]
        return [1] + [0] * len(ids_a) + [1] + [0] * len(ids_b) + [1]

    def truncate_sequences(
        self,
        ids_a: list[int],
        ids_b: list[int] | None,
        num_tokens_to_remove: int,
        strategy: str = "longest_first",
    ) -> tuple[list[int], list[int] | None]:
        """Remove ``num_tokens_to_remove`` ids from the right, as transformers' ``truncate_sequences``.

        ``longest_first`` first trims the longer sequence down to the length of the
        shorter, then takes the rest half from each (the second sequence gives the odd
        one); ``only_first`` / ``only_second`` trim that sequence only.

        Raises:
            ValueError: unknown strategy, ``only_second`` without a second sequence, or
                not enough tokens in the sequence(s) allowed to shrink.
        """
        if num_tokens_to_remove <= 0:
            return ids_a, ids_b
        len_a, len_b = len(ids_a), len(ids_b) if ids_b is not None else 0
        if strategy == "only_first" or (strategy == "longest_first" and ids_b is None):
            if num_tokens_to_remove > len_a:
                raise ValueError(
                    f"cannot truncate: {num_tokens_to_remove} tokens must go but the first sequence "
                    f"has only {len_a} (truncation={strategy!r}); raise max_length or use another strategy"
                )
            return ids_a[:-num_tokens_to_remove], ids_b
        if strategy == "only_second":
            if ids_b is None:
                raise ValueError("truncation='only_second' needs a text pair, got a single sequence")
            if num_tokens_to_remove > len_b:
                raise ValueError(
                    f"cannot truncate: {num_tokens_to_remove} tokens must go but the second sequence "
                    f"has only {len_b} (truncation='only_second'); raise max_length or use 'longest_first'"
                )
            return ids_a, ids_b[:-num_tokens_to_remove]
        if strategy != "longest_first":
            raise ValueError(
                f"truncation must be one of True, False, 'longest_first', 'only_first', 'only_second', "
                f"'do_not_truncate'; got {strategy!r}"
            )
        if num_tokens_to_remove > len_a + len_b:
            raise ValueError(
                f"cannot truncate: {num_tokens_to_remove} tokens must go but the pair has only "
                f"{len_a} + {len_b}; max_length is smaller than the special tokens"
            )
        first = min(abs(len_a - len_b), num_tokens_to_remove)
        rest = num_tokens_to_remove - first
        if len_a > len_b:
            cut_a, cut_b = first + rest // 2, rest - rest // 2
        else:
            cut_a, cut_b = rest // 2, first + rest - rest // 2
        if cut_a:
            ids_a = ids_a[:-cut_a]
        if cut_b:
            ids_b = ids_b[:-cut_b]
        return ids_a, ids_b

    def _encode_one(
        self,
        text,
        text_pair,
        add_special_tokens: bool,
        truncation: str | None,
        max_length: int | None,
    ) -> tuple[list[int], list[int], list[int]]:
        """-> (input_ids, token_type_ids, special_tokens_mask) of one example, unpadded."""
        ids_a = self._as_ids(text)
        ids_b = self._as_ids(text_pair) if text_pair is not None else None
        if truncation is not None and max_length is not None:
            n_special = self.num_special_tokens_to_add(ids_b is not None) if add_special_tokens else 0
            total = len(ids_a) + (len(ids_b) if ids_b is not None else 0) + n_special
            if total > max_length:
                ids_a, ids_b = self.truncate_sequences(ids_a, ids_b, total - max_length, truncation)
        if add_special_tokens:
            return (
                self.build_inputs_with_special_tokens(ids_a, ids_b),
                self.create_token_type_ids_from_sequences(ids_a, ids_b),
                self.get_special_tokens_mask(ids_a, ids_b),
            )
        ids = ids_a + (ids_b or [])
        types = [0] * len(ids_a) + [1] * (len(ids_b) if ids_b is not None else 0)
        return ids, types, [0] * len(ids)

    def _as_ids(self, text) -> list[int]:
        if isinstance(text, str):
            return self.text_to_ids(text)
        if isinstance(text, (list, tuple)) and all(isinstance(i, (int, np.integer)) for i in text):
            return [int(i) for i in text]  # already ids
        raise TypeError(f"expected a str (or a list of int ids), got {type(text).__name__}")

    def _check_options(self, truncation, padding, max_length):
        """(truncation mode, padding mode, max_length): ``max_length`` None becomes
        :attr:`model_max_length` when truncating or padding to a length (transformers'
        ``_get_padding_truncation_strategies``). Raises ValueError naming a bad option."""
        if truncation not in _TRUNCATION:
            raise ValueError(
                f"truncation must be one of {[k for k in _TRUNCATION]}; got {truncation!r}"
            )
        if padding not in _PADDING:
            raise ValueError(f"padding must be one of {[k for k in _PADDING]}; got {padding!r}")
        if max_length is not None and (not isinstance(max_length, (int, np.integer)) or max_length < 1):
            raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
        trunc, pad = _TRUNCATION[truncation], _PADDING[padding]
        if max_length is None and (trunc is not None or pad == "max_length"):
            max_length = self.model_max_length
        if pad == "max_length" and max_length is None:
            raise ValueError("padding='max_length' needs max_length (or a model_max_length), "
                             "got None")
        return trunc, pad, max_length

    def encode(
        self,
        text: str | list[int],
        text_pair: str | list[int] | None = None,
        add_special_tokens: bool = True,
        truncation: bool | str = False,
        max_length: int | None = None,
        padding: bool | str = False,
    ) -> list[int]:
        """Ids of ``[CLS] text [SEP]`` (or ``[CLS] text [SEP] text_pair [SEP]``).

        Args:
            text, text_pair: strings (or lists of ids, used as they are).
            add_special_tokens: add [CLS] / [SEP].
            truncation: ``False`` / ``True`` (= ``'longest_first'``) / ``'only_first'`` /
                ``'only_second'``; applied when ``max_length`` (or
                :attr:`model_max_length`) is set.
            max_length: the length (in tokens, specials included) to truncate / pad to
                (None: :attr:`model_max_length`).
            padding: ``'max_length'`` pads with ``pad_token_id`` up to ``max_length``.

        Returns:
            list of int token ids.

        Raises:
            ValueError: bad option, or a truncation that cannot reach ``max_length``.
        """
        trunc, pad, max_length = self._check_options(truncation, padding, max_length)
        ids, _, _ = self._encode_one(text, text_pair, add_special_tokens, trunc, max_length)
        if pad == "max_length" and len(ids) < max_length:
            ids = ids + [self.pad_token_id] * (max_length - len(ids))
        return ids

    def __call__(
        self, text: str | Sequence[str] | Sequence[tuple[str, str]] | Sequence[Sequence[str]],
        text_pair: str | Sequence[str] | Sequence[Sequence[str]] | None = None,
        add_special_tokens: bool = True, padding: bool | str = False,
        truncation: bool | str = False, max_length: int | None = None,
        pad_to_multiple_of: int | None = None, return_token_type_ids: bool = True,
        return_attention_mask: bool = True, return_special_tokens_mask: bool = False,
        return_length: bool = False, return_tensors: str | None = None, stride: int = 0,
        is_split_into_words: bool = False, return_overflowing_tokens: bool = False,
        return_offsets_mapping: bool = False,
    ) -> BatchEncoding:
        """Encode one example or a batch into model inputs.

        ``text``: a str, a list of str (a batch) or of ``(a, b)`` tuples; ``text_pair``: None
        or like ``text``; with ``is_split_into_words`` each text is a list of words instead.

        Args:
            padding: ``False``, ``True`` / ``'longest'`` (the batch's longest row) or
                ``'max_length'``; on the right, ``pad_token_id`` (type 0, attention 0).
            truncation, max_length: see :meth:`encode` (tokens, special tokens included).
            pad_to_multiple_of: round the padded length up to a multiple of this.
            return_tensors: ``None`` (lists) or ``'np'``: int64 arrays, ``(T,)`` for one
                example, ``(B, T)`` for a batch (which must then be padded to one length);
                ``offset_mapping`` ``(T, 2)`` / ``(B, T, 2)``.
            stride: tokens each window of a truncated sequence shares with the one before
                (:meth:`overflow_windows`); checked whenever truncation happens, also
                without ``return_overflowing_tokens`` (the first window is the result).
            is_split_into_words: the input is pre-split into words, each tokenized on its
                own; ``word_ids()`` gives its index, offsets are relative to the word.
            return_overflowing_tokens: every window of the truncated sequence is a row,
                with ``overflow_to_sample_mapping`` (row -> example) and always a row axis;
                ``'only_second'`` windows the second text (SQuAD's question + context),
                ``'only_first'`` (``True`` for a single text) the first.
            return_offsets_mapping: add ``offset_mapping``: each token's ``(start, end)``
                in its own original text, ``(0, 0)`` for [CLS], [SEP] and padding
                (:mod:`minibert.tokenization.alignment`).
        Returns:
            :class:`~minibert.tokenization.encoding.BatchEncoding` (a dict): ``input_ids``
            and the columns asked for (``length``: the unpadded lengths); its
            ``word_ids(i)`` / ``sequence_ids(i)`` give each token's word and sequence.
        Raises:
            ValueError: bad option, batch sizes that differ, a ragged batch with ``'np'``,
                an impossible truncation, a ``stride`` not below the window length, windows
                of a pair under ``'longest_first'``, offsets asked for input given as ids.
            TypeError: an input that is neither text (words) nor ids.

        Source: transformers ``PreTrainedTokenizerFast.__call__``, ``tokenizers``' windows.
        """
        trunc, pad, max_length = self._check_call_options(truncation, padding, max_length,
                                                          return_tensors, stride)
        batched, examples = self._examples(text, text_pair, is_split_into_words)
        rows, sample_of_row = self._encode_rows(
            examples, is_split_into_words, return_offsets_mapping, add_special_tokens, trunc,
            max_length, stride, return_overflowing_tokens)
        columns = [k for k, on in zip(_OPTIONAL_COLUMNS, (return_token_type_ids, return_attention_mask,
                   return_special_tokens_mask, return_offsets_mapping)) if on]
        target = _padded_length(pad, rows, max_length, pad_to_multiple_of)
        return self._batch_encoding(rows, target, columns, batched, sample_of_row,
                                    return_length, return_tensors)

    def _check_call_options(self, truncation, padding, max_length, return_tensors, stride):
        """:meth:`_check_options` (the truncation and padding modes), then
        ``return_tensors`` and ``stride``. Raises ValueError naming the bad option."""
        trunc, pad, max_length = self._check_options(truncation, padding, max_length)
        if return_tensors not in (None, "np"):
            raise ValueError(f"return_tensors must be None or 'np', got {return_tensors!r}")
        if not isinstance(stride, (int, np.integer)) or stride < 0:
            raise ValueError(f"stride must be an int >= 0, got {stride!r}")
        return trunc, pad, max_length

    def _batch_encoding(self, rows: list[_Row], target, columns: list[str], batched: bool,
                        sample_of_row: list[int] | None, return_length: bool,
                        return_tensors: str | None) -> BatchEncoding:
        """What :meth:`__call__` returns for its unpadded ``rows``: padded to ``target``
        with the asked ``columns``; with ``sample_of_row`` (overflowing windows) the
        ``overflow_to_sample_mapping`` column and always a row axis; ``length`` when asked;
        int64 arrays for ``return_tensors='np'``; one example's row unwrapped."""
        out, word_ids, sequence_ids = self._pad_rows(rows, target, columns)
        if sample_of_row is not None:
            out["overflow_to_sample_mapping"], batched = sample_of_row, True
        if return_length:
            out["length"] = [len(r.ids) for r in rows]
        out = _as_arrays(out) if return_tensors == "np" else out
        out = out if batched else {k: v[0] for k, v in out.items()}
        return BatchEncoding(out, word_ids, sequence_ids, batched=batched)

    def _encode_rows(self, examples, is_split_into_words: bool, offsets: bool,
                     add_special_tokens: bool, trunc, max_length, stride: int,
                     overflowing: bool) -> tuple[list[_Row], list[int] | None]:
        """The unpadded rows of every example (several per example with ``overflowing``
        windows) and, with ``overflowing``, per row the index of its example (else None)."""
        rows: list[_Row] = []
        sample_of_row: list[int] = []
        for i, (a, b) in enumerate(examples):
            seq_a = self._as_sequence(a, is_split_into_words, offsets)
            seq_b = self._as_sequence(b, is_split_into_words, offsets) if b is not None else None
            for row in self._rows(seq_a, seq_b, add_special_tokens, trunc, max_length, stride,
                                  overflowing):
                rows.append(row)
                sample_of_row.append(i)
        return rows, (sample_of_row if overflowing else None)

    def _pad_rows(self, rows: list[_Row], target: int | None, columns: list[str]):
        """Pad every row on the right to ``target`` tokens (None: no padding): returns
        ({"input_ids": ..., and each of ``columns``}: lists of lists, word ids per row (None
        unless every row has them), sequence ids per row)."""
        pad_of = {"input_ids": self.pad_token_id, "token_type_ids": 0, "attention_mask": 0,
                  "special_tokens_mask": 1, "offset_mapping": (0, 0)}
        out: dict[str, list] = {k: [] for k in ("input_ids", *columns)}
        has_words = all(r.words is not None for r in rows)
        word_ids: list[list[int | None]] = []
        sequence_ids: list[list[int | None]] = []
        for r in rows:
            n_pad = max(0, target - len(r.ids)) if target is not None else 0
            values = {"input_ids": r.ids, "token_type_ids": r.types,
                      "attention_mask": [1] * len(r.ids), "special_tokens_mask": r.special,
                      "offset_mapping": r.offsets}
            for k, column in out.items():
                column.append(values[k] + [pad_of[k]] * n_pad)
            if has_words:
                word_ids.append(r.words + [None] * n_pad)
            sequence_ids.append(r.sequences + [None] * n_pad)
        return out, (word_ids if has_words else None), sequence_ids

    def _examples(self, text, text_pair, is_split_into_words: bool) -> tuple[bool, list[tuple]]:
        """-> (batched, [(a, b_or_None), ...]) from ``__call__``'s ``text`` / ``text_pair``."""
        if is_split_into_words:
            if not isinstance(text, (list, tuple)):
                raise TypeError(f"is_split_into_words=True needs a list of words, got {type(text).__name__}")
            batched = bool(text) and all(isinstance(t, (list, tuple)) for t in text)
        else:
            batched = isinstance(text, (list, tuple)) and not (
                text and all(isinstance(i, (int, np.integer)) for i in text)
            )
        if not batched:
            return False, [(text, text_pair)]
        if text_pair is not None:
            if not isinstance(text_pair, (list, tuple)) or len(text_pair) != len(text):
                got = len(text_pair) if isinstance(text_pair, (list, tuple)) else type(text_pair).__name__
                raise ValueError(f"text is a batch of {len(text)}; text_pair must be a list of the same length, got {got}")
            return True, list(zip(text, text_pair))
        if is_split_into_words:
            return True, [(t, None) for t in text]
        examples = [tuple(t) if isinstance(t, tuple) else (t, None) for t in text]
        for i, ex in enumerate(examples):
            if len(ex) != 2:
                raise ValueError(f"batch item {i}: expected a str or an (a, b) pair, got a tuple of {len(ex)}")
        return True, examples

    def _as_sequence(self, text, is_split_into_words: bool, need_offsets: bool) -> AlignedIds:
        """One text (or word list, or id list) -> ids with offsets and word ids (``None``
        for id input, which has no text to point into)."""
        if is_split_into_words or isinstance(text, str):
            return self.text_to_ids_with_offsets(text, is_split_into_words=is_split_into_words)
        ids = self._as_ids(text)
        if need_offsets:
            raise ValueError("return_offsets_mapping=True needs text; got token ids, which have no characters")
        return AlignedIds(ids, None, None)

    def _rows(
        self,
        a: AlignedIds,
        b: AlignedIds | None,
        add_special_tokens: bool,
        truncation: str | None,
        max_length: int | None,
        stride: int,
        overflow: bool,
    ) -> list["_Row"]:
        """The rows of one example: one, or one per window with ``overflow``."""
        windows_a = [(0, len(a.ids))]
        windows_b = [(0, len(b.ids))] if b is not None else None
        n_special = self.num_special_tokens_to_add(b is not None) if add_special_tokens else 0
        total = len(a.ids) + (len(b.ids) if b is not None else 0) + n_special
        if truncation is not None and max_length is not None and total > max_length:
            to_remove = total - max_length
            if (overflow or stride) and not (truncation == "longest_first" and b is not None):
                if truncation == "only_second" and b is None:
                    raise ValueError("truncation='only_second' needs a text pair, got a single sequence")
                second = truncation == "only_second"
                n = len(b.ids) if second else len(a.ids)
                if n <= to_remove:
                    which = "second" if second else "first"
                    raise ValueError(
                        f"cannot truncate: {to_remove} tokens must go but the {which} sequence has only {n} "
                        f"(truncation={truncation!r}, max_length={max_length}); at least one of its tokens "
                        "must stay in each window"
                    )
                windows = self.overflow_windows(n, n - to_remove, stride)
                if second:
                    windows_b = windows
                else:
                    windows_a = windows
            elif overflow:
                raise ValueError(
                    "return_overflowing_tokens=True cannot window a pair with truncation='longest_first' "
                    "(transformers refuses it too); use truncation='only_second' or 'only_first'"
                )
            else:
                ids_a, ids_b = self.truncate_sequences(a.ids, b.ids if b is not None else None, to_remove, truncation)
                windows_a = [(0, len(ids_a))]
                windows_b = [(0, len(ids_b))] if b is not None else None
        if not overflow:
            windows_a = windows_a[:1]
            windows_b = windows_b[:1] if windows_b is not None else None
        rows = []
        for wa in windows_a:
            for wb in windows_b if windows_b is not None else (None,):
                rows.append(self._row(a, wa, b, wb, add_special_tokens))
        return rows

    @staticmethod
    def overflow_windows(length: int, max_len: int, stride: int) -> list[tuple[int, int]]:
        """Windows ``(start, stop)`` over a sequence of ``length`` tokens, at most ``max_len``
        long, each starting ``max_len - stride`` after the one before; the last ends at
        ``length``. One window ``(0, length)`` when it fits.

        Same windows as ``tokenizers``' ``Encoding.truncate(max_len, stride)`` (direction
        right), which transformers' fast tokenizers use for ``return_overflowing_tokens``.

        Raises:
            ValueError: ``max_len < 1`` while ``length > max_len``, or ``stride >= max_len``.
        """
        if max_len >= length:
            return [(0, length)]
        if max_len < 1:
            raise ValueError(f"window length must be >= 1, got {max_len}")
        if stride >= max_len:
            raise ValueError(
                f"stride={stride} must be smaller than the window length {max_len} (max_length minus the "
                "special tokens and the other sequence's tokens)"
            )
        step = max_len - stride
        out = []
        for start in range(0, length, step):
            stop = min(start + max_len, length)
            out.append((start, stop))
            if stop == length:
                break
        return out

    def _row(self, a: AlignedIds, wa: tuple[int, int], b: AlignedIds | None, wb, add_special_tokens: bool) -> "_Row":
        """Assemble one row from the window ``wa`` of ``a`` and ``wb`` of ``b`` (``None`` if no pair)."""
        seqs = [(a, wa, 0)] + ([(b, wb, 1)] if b is not None else [])
        parts = [(s.ids[lo:hi], s.offsets[lo:hi] if s.offsets is not None else None,
                  s.word_ids[lo:hi] if s.word_ids is not None else None, k) for s, (lo, hi), k in seqs]
        ids_a, ids_b = parts[0][0], parts[1][0] if b is not None else None
        has_offsets = all(p[1] is not None for p in parts)
        has_words = all(p[2] is not None for p in parts)
        if add_special_tokens:
            ids = self.build_inputs_with_special_tokens(ids_a, ids_b)
            types = self.create_token_type_ids_from_sequences(ids_a, ids_b)
            special = self.get_special_tokens_mask(ids_a, ids_b)
            sequences, offsets, words = [None], [(0, 0)], [None]  # [CLS], then A [SEP] (B [SEP])
            for p_ids, p_offsets, p_words, k in parts:
                sequences += [k] * len(p_ids) + [None]
                if has_offsets:
                    offsets += p_offsets + [(0, 0)]
                if has_words:
                    words += p_words + [None]
        else:
            ids = [i for p in parts for i in p[0]]
            types = [k for p in parts for k in [p[3]] * len(p[0])]
            special = [0] * len(ids)
            sequences = list(types)
            offsets = [o for p in parts for o in p[1]] if has_offsets else None
            words = [w for p in parts for w in p[2]] if has_words else None
        return _Row(ids, types, special, offsets if has_offsets else None, words if has_words else None, sequences)

    # ------------------------------------------------------------------ decoding
    @staticmethod
    def clean_up_tokenization(text: str) -> str:
        """Drop the space before ``. ? ! ,`` and inside English contractions (transformers' rule)."""
        return (
            text.replace(" .", ".")
            .replace(" ?", "?")
            .replace(" !", "!")
            .replace(" ,", ",")
            .replace(" ' ", "'")
            .replace(" n't", "n't")
            .replace(" 'm", "'m")
            .replace(" 's", "'s")
            .replace(" 've", "'ve")
            .replace(" 're", "'re")
        )

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Join tokens with spaces and glue ``##`` pieces to the piece before them."""
        return " ".join(tokens).replace(" ##", "").strip()

    def decode(
        self,
        ids: Sequence[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        """Ids -> text: tokens joined by spaces, ``##`` pieces glued (transformers' ``decode``).

        Args:
            ids: token ids (list, tuple or 1-D array).
            skip_special_tokens: leave out [CLS], [SEP], [PAD], [MASK], [UNK].
            clean_up_tokenization_spaces: ``None`` uses the constructor's setting.
        """
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()
        text = self.convert_tokens_to_string(self.convert_ids_to_tokens(list(ids), skip_special_tokens))
        clean = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        return self.clean_up_tokenization(text) if clean else text

    def batch_decode(self, batch: Sequence[Sequence[int]], **kwargs) -> list[str]:
        """:meth:`decode` for each row of ``batch``."""
        return [self.decode(ids, **kwargs) for ids in batch]

    # ------------------------------------------------------------------ saving
    def save_vocabulary(self, save_directory: str | os.PathLike, filename_prefix: str | None = None) -> tuple[str]:
        """Write the vocab (by id) to ``save_directory/[prefix-]vocab.txt`` atomically
        (:func:`~minibert.tokenization.vocab.write_vocab`).

        If ``save_directory`` is not an existing directory it is taken as the file path.
        Returns a 1-tuple with the path written (as transformers does).
        """
        directory = Path(save_directory)
        name = (filename_prefix + "-" if filename_prefix else "") + "vocab.txt"
        path = directory / name if directory.is_dir() else Path(
            (filename_prefix + "-" if filename_prefix else "") + str(save_directory)
        )
        tokens = [t for t, _ in sorted(self.vocab.items(), key=lambda kv: kv[1])]
        write_vocab(tokens, path)
        return (str(path),)
