"""MLM + NSP pretraining data: corpus reading, a compact token store, instances, batches.

The semantics follow google-research/bert ``create_pretraining_data.py``
(``create_training_instances``, ``create_instances_from_document``,
``create_masked_lm_predictions``, ``truncate_seq_pair``); the organisation does not.
The reference tokenizes the corpus, then builds every instance for every one of
``dupe_factor`` copies and holds them all in memory before writing them out. Here:

1. ``build_store`` tokenizes the corpus once into a :class:`TokenStore`: one flat
   int32 array of WordPiece ids plus two int64 offset arrays (sentence starts and
   document starts). About 4 bytes per token; it can be saved as ``.npy`` files and
   memory-mapped back (``load_store``), so a large corpus is tokenized once.
2. ``iterate_batches`` generates instances on the fly from the store, document by
   document, through a bounded shuffle buffer. Nothing proportional to
   ``corpus x dupe_factor`` is ever held in memory.

Randomness. Every function that draws takes an explicit ``rng``, always a
``numpy.random.Generator``. Epoch iteration derives one generator per
(purpose, seed, copy, document) from a ``SeedSequence``; a document's instances and
masks therefore depend only on those integers, never on how many draws other
documents made, which is what makes ``start_batch`` resumption exact.

Labels. ``next_sentence_label`` is 0 when B really follows A (IsNext) and 1 when B was
taken from another document, as in the reference and in Hugging Face. MLM ``labels``
hold the original token id at masked positions and -100 elsewhere.

Shape legend: B = batch, T = padded sequence length, L = one instance's length,
P = one instance's number of predictions, N = tokens in the store, S = sentences,
D = documents, V = vocabulary size.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

__all__ = [
    "CorpusError",
    "TokenStore",
    "VocabInfo",
    "Instance",
    "Batch",
    "resolve_corpus_files",
    "iter_documents",
    "build_store",
    "save_store",
    "load_store",
    "build_or_load_store",
    "split_documents",
    "truncate_seq_pair",
    "create_instances_from_document",
    "create_masked_lm_predictions",
    "iterate_instances",
    "count_instances",
    "collate",
    "iterate_batches",
    "make_eval_batches",
    "token_counts",
    "unigram_cross_entropy",
]

IGNORE_INDEX = -100
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Tags that keep the generators of different purposes apart (the first word of each
# SeedSequence entropy list).
_TAG_PAIRS, _TAG_MASKS, _TAG_ORDER, _TAG_SPLIT = 101, 202, 303, 404
_STORE_FORMAT = 1


class CorpusError(ValueError):
    """The pretraining corpus (or a saved token store) cannot be used; the message says why and where."""


# ----------------------------------------------------------------------------------------
# Reading the corpus
# ----------------------------------------------------------------------------------------


def resolve_corpus_files(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Expand corpus paths into the list of text files to read, in order.

    Inputs:
        paths: one path or a list of paths; a file is taken as is, a directory
            contributes its ``*.txt`` files (not recursive), sorted by name.
    Returns:
        list of ``Path``, in the order given (directories expanded in place).
    Raises:
        CorpusError: a path does not exist, a directory holds no ``*.txt`` file, or no
            path was given.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = sorted(q for q in p.glob("*.txt") if q.is_file())
            if not found:
                raise CorpusError(f"corpus directory {p} holds no *.txt file")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise CorpusError(f"corpus file not found: {p}")
    if not files:
        raise CorpusError("no corpus file given")
    return files


def iter_documents(files: Sequence[str | os.PathLike], progress: tqdm | None = None) -> Iterator[list[str]]:
    """Stream documents from corpus files: one sentence per line, blank line between documents.

    As ``create_training_instances`` in the reference, each line is stripped, a blank
    line closes the current document and empty documents are dropped. Unlike the
    reference, the end of a file also closes a document (the reference would glue the
    last document of one file to the first of the next when a file lacks a final blank
    line). A UTF-8 byte-order mark at the start of a file is dropped.

    Inputs:
        files: paths of UTF-8 text files (see ``resolve_corpus_files``).
        progress: optional tqdm bar counting bytes; updated per line.
    Yields:
        list[str]: the stripped, non-empty sentences of one document.
    Raises:
        CorpusError: a file is missing, or a line is not valid UTF-8 (the message gives
            the file, the 1-based line number and the byte offset within the line).
    """
    for path in files:
        path = Path(path)
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            raise CorpusError(f"corpus file not found: {path}") from None
        with fh:
            doc: list[str] = []
            for lineno, raw in enumerate(fh, start=1):
                if progress is not None:
                    progress.update(len(raw))
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise CorpusError(
                        f"{path}:{lineno}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at "
                        f"column {e.start + 1}: {e.reason}); re-encode the file as UTF-8"
                    ) from None
                if lineno == 1 and line.startswith("\ufeff"):
                    line = line[1:]
                line = line.strip()
                if line:
                    doc.append(line)
                elif doc:
                    yield doc
                    doc = []
            if doc:
                yield doc


# ----------------------------------------------------------------------------------------
# The token store
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenStore:
    """A tokenized corpus: documents -> sentences -> WordPiece ids, in three flat arrays.

    Sentence ``s`` is ``tokens[sentence_offsets[s]:sentence_offsets[s + 1]]``; document
    ``d`` of the underlying arrays is sentences ``document_offsets[d]`` to
    ``document_offsets[d + 1]``. ``doc_ids``, when set, makes this a view on a subset of
    the underlying documents (``split_documents`` uses it so that neither half copies
    the token array, which may be memory-mapped); document ``i`` of the view is
    underlying document ``doc_ids[i]``.

    Fields:
        tokens: (N,) int32 token ids.
        sentence_offsets: (S + 1,) int64, starting at 0 and ending at N.
        document_offsets: (D + 1,) int64, starting at 0 and ending at S.
        doc_ids: (D',) int64 or None (all D documents, in order).
    Every sentence and every document is non-empty.
    """

    tokens: np.ndarray
    sentence_offsets: np.ndarray
    document_offsets: np.ndarray
    doc_ids: np.ndarray | None = None

    @property
    def num_documents(self) -> int:
        """Documents in this store (or view)."""
        if self.doc_ids is not None:
            return int(len(self.doc_ids))
        return int(len(self.document_offsets) - 1)

    def _underlying(self, d: int) -> int:
        return int(self.doc_ids[d]) if self.doc_ids is not None else int(d)

    def sentence_range(self, d: int) -> tuple[int, int]:
        """(first sentence, one past the last) of document ``d`` in the underlying arrays."""
        u = self._underlying(d)
        return int(self.document_offsets[u]), int(self.document_offsets[u + 1])

    def token_range(self, d: int) -> tuple[int, int]:
        """(first token, one past the last) of document ``d`` in ``tokens``."""
        s0, s1 = self.sentence_range(d)
        return int(self.sentence_offsets[s0]), int(self.sentence_offsets[s1])

    def document(self, d: int) -> list[np.ndarray]:
        """The sentences of document ``d``, as a list of (len,) int32 views of ``tokens``."""
        s0, s1 = self.sentence_range(d)
        offs = np.asarray(self.sentence_offsets[s0 : s1 + 1])
        offs = (offs - offs[0]).tolist()
        # One slice of the (possibly memory-mapped) array, then plain-ndarray views of it:
        # slicing a np.memmap many times is slow.
        toks = np.asarray(self.tokens[int(self.sentence_offsets[s0]) : int(self.sentence_offsets[s1])])
        return [toks[offs[k] : offs[k + 1]] for k in range(len(offs) - 1)]

    def read_from(self, d: int, start: int, min_tokens: int) -> np.ndarray:
        """Whole sentences of document ``d`` from sentence ``start`` on, until at least ``min_tokens``.

        Stops early at the end of the document; always returns at least the sentence
        ``start``. Returns a (n,) int32 array (a view of ``tokens``).
        """
        s0, s1 = self.sentence_range(d)
        so = self.sentence_offsets
        t0 = int(so[s0 + start])
        ends = np.asarray(so[s0 + start + 1 : s1 + 1])
        j = int(np.searchsorted(ends - t0, max(min_tokens, 1), side="left"))
        t1 = int(ends[min(j, len(ends) - 1)])
        return np.asarray(self.tokens[t0:t1])

    def num_sentences_in(self, d: int) -> int:
        """Sentences in document ``d``."""
        s0, s1 = self.sentence_range(d)
        return s1 - s0

    def _sentence_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(D',) first sentence and (D',) one past the last, of each document of this view."""
        do = np.asarray(self.document_offsets)
        ids = self.doc_ids if self.doc_ids is not None else np.arange(len(do) - 1)
        return do[ids], do[ids + 1]

    def document_lengths(self) -> np.ndarray:
        """(D',) int64 tokens per document of this store (or view)."""
        first, end = self._sentence_bounds()
        so = self.sentence_offsets
        return np.asarray(so[end] - so[first], dtype=np.int64)

    def sentences_per_document(self) -> np.ndarray:
        """(D',) int64 sentences in each document of this store (or view)."""
        first, end = self._sentence_bounds()
        return (end - first).astype(np.int64)

    @property
    def num_sentences(self) -> int:
        """Sentences in this store (or view)."""
        if self.doc_ids is None:
            return int(self.document_offsets[-1])
        return int(self.sentences_per_document().sum())

    @property
    def num_tokens(self) -> int:
        """Tokens in this store (or view)."""
        if self.doc_ids is None:
            return int(len(self.tokens))
        return int(self.document_lengths().sum())

    def subset(self, doc_ids: Sequence[int] | np.ndarray) -> "TokenStore":
        """A view on documents ``doc_ids`` (indices into this store), copying no tokens."""
        idx = np.asarray(doc_ids, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= self.num_documents)):
            raise IndexError(f"document indices out of range [0, {self.num_documents})")
        if self.doc_ids is not None:
            idx = np.asarray(self.doc_ids, dtype=np.int64)[idx]
        return TokenStore(self.tokens, self.sentence_offsets, self.document_offsets, idx)

    def compact(self) -> "TokenStore":
        """A store without ``doc_ids`` holding copies of just this view's documents."""
        if self.doc_ids is None:
            return self
        toks, sent, docs = [], [0], [0]
        n_tok = 0
        for d in range(self.num_documents):
            s0, s1 = self.sentence_range(d)
            t0, t1 = self.token_range(d)
            toks.append(np.asarray(self.tokens[t0:t1], dtype=np.int32))
            offs = np.asarray(self.sentence_offsets[s0 + 1 : s1 + 1], dtype=np.int64) - t0 + n_tok
            sent.extend(offs.tolist())
            n_tok += t1 - t0
            docs.append(docs[-1] + (s1 - s0))
        tokens = np.concatenate(toks) if toks else np.zeros(0, np.int32)
        return TokenStore(tokens, np.asarray(sent, np.int64), np.asarray(docs, np.int64))


def build_store(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    tokenizer,
    show_progress: bool = True,
    min_documents: int = 2,
) -> TokenStore:
    """Tokenize a corpus into a :class:`TokenStore` (the reading half of ``create_training_instances``).

    Each non-blank line is ``tokenizer.tokenize``-d and converted to ids; a line that
    yields no token is dropped (as the reference does), and so is a document left empty.
    Memory while building: about 4 bytes per token plus 8 per sentence.

    Inputs:
        paths: files and/or directories (see ``resolve_corpus_files``).
        tokenizer: object with ``tokenize(str) -> list[str]`` and
            ``convert_tokens_to_ids(list[str]) -> list[int]``.
        show_progress: show a tqdm bar (bytes read) while tokenizing.
        min_documents: fewer documents than this is an error (NSP needs a second
            document to draw random B sentences from).
    Returns:
        TokenStore with int32 tokens and int64 offsets.
    Raises:
        CorpusError: missing file, undecodable bytes (file and line), empty corpus, or
            fewer than ``min_documents`` documents (no blank-line document breaks).
    """
    files = resolve_corpus_files(paths)
    total = sum(f.stat().st_size for f in files)
    # Compact growable buffers (4 bytes per token, 8 per sentence), not a list of arrays.
    tokens = array("i")
    sent_ends = array("q", [0])
    doc_ends = array("q", [0])
    n_tok = 0
    empty_files = []
    with tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing corpus",
              disable=not show_progress) as bar:
        for f in files:
            before = len(doc_ends)
            for doc in iter_documents([f], progress=bar):
                n_sent = 0
                for line in doc:
                    ids = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(line))
                    if not ids:
                        continue
                    tokens.extend(ids)
                    n_tok += len(ids)
                    sent_ends.append(n_tok)
                    n_sent += 1
                if n_sent:
                    doc_ends.append(doc_ends[-1] + n_sent)
            if len(doc_ends) == before:
                empty_files.append(f)
    n_docs = len(doc_ends) - 1
    if n_docs == 0:
        names = ", ".join(str(f) for f in files)
        raise CorpusError(f"the corpus is empty: no tokenizable text in {names}")
    for f in empty_files:
        warnings.warn(f"corpus file {f} holds no text; skipped", stacklevel=2)
    if n_docs < min_documents:
        names = ", ".join(str(f) for f in files)
        raise CorpusError(
            f"the corpus ({names}) holds {n_docs} document(s) but at least {min_documents} "
            "are needed: documents are separated by a blank line, and next-sentence "
            "prediction draws its random B sentences from another document. "
            "Insert blank lines between documents."
        )
    return TokenStore(
        np.frombuffer(tokens, dtype=np.intc).astype(np.int32),
        np.frombuffer(sent_ends, dtype=np.int64).copy(),
        np.frombuffer(doc_ends, dtype=np.int64).copy(),
    )


_STORE_FILES = ("tokens.npy", "sentence_offsets.npy", "document_offsets.npy")


def save_store(store: TokenStore, directory: str | os.PathLike, meta: Mapping | None = None) -> Path:
    """Write a store as ``tokens.npy``, ``sentence_offsets.npy``, ``document_offsets.npy``, ``store.json``.

    A view (``doc_ids`` set) is compacted first. Each file is written to a temporary
    name and renamed, and ``store.json`` is written last, so a crash never leaves a
    directory that ``load_store`` accepts with mismatched arrays.

    Returns:
        the directory as a ``Path``.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    store = store.compact()
    marker = out / "store.json"
    if marker.exists():
        marker.unlink()
    for name, arr in zip(_STORE_FILES, (store.tokens, store.sentence_offsets, store.document_offsets)):
        tmp = out / (name + ".tmp")
        with open(tmp, "wb") as fh:
            np.save(fh, np.ascontiguousarray(arr))
        os.replace(tmp, out / name)
    info = {
        "format": _STORE_FORMAT,
        "num_tokens": store.num_tokens,
        "num_sentences": store.num_sentences,
        "num_documents": store.num_documents,
        "meta": dict(meta or {}),
    }
    tmp = out / "store.json.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, marker)
    return out


def load_store(directory: str | os.PathLike, mmap: bool = True) -> TokenStore:
    """Load a store written by ``save_store``; arrays memory-mapped read-only when ``mmap``.

    Raises:
        CorpusError: a file is missing, the format is unknown, or the arrays disagree.
    """
    d = Path(directory)
    marker = d / "store.json"
    if not marker.is_file():
        raise CorpusError(f"{d} holds no complete token store (store.json missing)")
    info = json.loads(marker.read_text())
    if info.get("format") != _STORE_FORMAT:
        raise CorpusError(f"{marker}: unknown store format {info.get('format')!r}")
    arrs = []
    for name in _STORE_FILES:
        p = d / name
        if not p.is_file():
            raise CorpusError(f"token store file missing: {p}")
        arrs.append(np.load(p, mmap_mode="r" if mmap else None))
    store = TokenStore(*arrs)
    if (
        store.tokens.dtype != np.int32
        or len(store.tokens) != info["num_tokens"]
        or store.sentence_offsets[-1] != len(store.tokens)
        or store.document_offsets[-1] != len(store.sentence_offsets) - 1
    ):
        raise CorpusError(f"token store in {d} is inconsistent; delete it and rebuild")
    return store


def _fingerprint(files: Sequence[Path], tokenizer) -> str:
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    vocab = getattr(tokenizer, "vocab", {})
    for tok, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{i}\t{tok}\n".encode("utf-8", "surrogatepass"))
    # The vocab alone does not say how text is normalised (lower-casing, accents):
    # hash how the tokenizer handles a probe string too.
    probe = "Hello WORLD Ünïcödé naïve 中文 don't x2.5"
    h.update(repr(tokenizer.tokenize(probe)).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def build_or_load_store(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    tokenizer,
    cache_dir: str | os.PathLike,
    show_progress: bool = True,
) -> TokenStore:
    """``build_store`` once, then reuse the memory-mapped copy in ``cache_dir``.

    The cache is keyed by the corpus files (path, size, mtime) and the tokenizer (its
    vocab and how it tokenizes a probe string); a mismatch rebuilds it.
    """
    files = resolve_corpus_files(paths)
    key = _fingerprint(files, tokenizer)
    cdir = Path(cache_dir)
    marker = cdir / "store.json"
    if marker.is_file():
        try:
            if json.loads(marker.read_text()).get("meta", {}).get("fingerprint") == key:
                return load_store(cdir)
        except (CorpusError, ValueError, OSError):
            pass
    store = build_store(files, tokenizer, show_progress=show_progress)
    save_store(store, cdir, meta={"fingerprint": key, "files": [str(f) for f in files]})
    return load_store(cdir)


def split_documents(
    store: TokenStore,
    eval_fraction: float | None = None,
    eval_documents: int | None = None,
    seed: int = 0,
    min_documents: int = 2,
) -> tuple[TokenStore, TokenStore]:
    """Hold out whole documents for evaluation: a deterministic split by ``seed``.

    Give exactly one of ``eval_fraction`` (rounded, at least ``min_documents`` when > 0)
    or ``eval_documents``. The held-out documents are drawn by a permutation seeded
    with ``seed``; both halves keep the store's document order and are views (no copy).

    Returns:
        (train_store, eval_store).
    Raises:
        ValueError: both or neither of eval_fraction / eval_documents, or out of range.
        CorpusError: either half would hold fewer than ``min_documents`` documents (each
            half needs two to draw random NSP sentences from another document).
    """
    if (eval_fraction is None) == (eval_documents is None):
        raise ValueError("give exactly one of eval_fraction or eval_documents")
    D = store.num_documents
    if eval_fraction is not None:
        if not 0.0 <= eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        n_eval = int(round(eval_fraction * D))
        if eval_fraction > 0:
            n_eval = max(n_eval, min_documents)
    else:
        n_eval = int(eval_documents)
        if n_eval < 0:
            raise ValueError(f"eval_documents must be >= 0, got {eval_documents}")
    if n_eval and n_eval < min_documents:
        raise CorpusError(f"{n_eval} held-out document(s); at least {min_documents} are needed for NSP")
    if D - n_eval < min_documents:
        raise CorpusError(
            f"the corpus has {D} documents; holding out {n_eval} leaves {D - n_eval} for training, "
            f"at least {min_documents} are needed"
        )
    _check_seed(seed=seed)
    perm = np.random.default_rng([_TAG_SPLIT, seed]).permutation(D)
    eval_ids = np.sort(perm[:n_eval])
    train_ids = np.sort(perm[n_eval:])
    return store.subset(train_ids), store.subset(eval_ids)


# ----------------------------------------------------------------------------------------
# Vocabulary facts the masking needs
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VocabInfo:
    """What instance creation needs to know about the vocabulary.

    Fields:
        vocab_size: V (largest id + 1).
        pad_id, unk_id, cls_id, sep_id, mask_id: ids of the special tokens.
        is_continuation: (V,) bool, True for ``##`` pieces (whole-word masking).
        random_ids: (R,) int64, the ids the 10% "random token" replacement draws from.
    """

    vocab_size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray
    random_ids: np.ndarray

    @classmethod
    def from_vocab(cls, vocab: Mapping[str, int], exclude_special_from_random: bool = True) -> "VocabInfo":
        """Build from a token -> id mapping holding [PAD], [UNK], [CLS], [SEP] and [MASK].

        The reference draws the random replacement from the whole vocabulary. By default
        we leave out the five special tokens: a [CLS] or [SEP] dropped mid-sequence looks
        like a segment boundary, a [PAD] is a token the model never otherwise attends to,
        and a random [MASK] would quietly raise the [MASK] share above 80%. These tokens
        are a handful out of tens of thousands, so the distribution barely changes.

        Raises:
            ValueError: a special token is missing.
        """
        missing = [t for t in SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise ValueError(f"vocabulary lacks special token(s) {missing}")
        V = max(vocab.values()) + 1
        is_cont = np.zeros(V, dtype=bool)
        present = np.zeros(V, dtype=bool)
        for tok, i in vocab.items():
            present[i] = True
            if tok.startswith("##") and len(tok) > 2:
                is_cont[i] = True
        allowed = present.copy()
        if exclude_special_from_random:
            for t in SPECIAL_TOKENS:
                allowed[vocab[t]] = False
        return cls(
            vocab_size=int(V),
            pad_id=int(vocab["[PAD]"]),
            unk_id=int(vocab["[UNK]"]),
            cls_id=int(vocab["[CLS]"]),
            sep_id=int(vocab["[SEP]"]),
            mask_id=int(vocab["[MASK]"]),
            is_continuation=is_cont,
            random_ids=np.flatnonzero(allowed).astype(np.int64),
        )

    @classmethod
    def from_tokenizer(cls, tokenizer, exclude_special_from_random: bool = True) -> "VocabInfo":
        """Build from a tokenizer's ``vocab`` dict (see ``from_vocab``)."""
        return cls.from_vocab(tokenizer.vocab, exclude_special_from_random)


# ----------------------------------------------------------------------------------------
# Instances
# ----------------------------------------------------------------------------------------


@dataclass
class Instance:
    """One masked sentence pair ``[CLS] A [SEP] B [SEP]`` (the reference's ``TrainingInstance``).

    Fields:
        input_ids: (L,) int32, after masking.
        token_type_ids: (L,) int8, 0 for [CLS] A [SEP], 1 for B [SEP].
        masked_positions: (P,) int32, increasing positions that carry an MLM label.
        masked_labels: (P,) int32, the original ids at those positions.
        next_sentence_label: 0 = B follows A in the document (IsNext), 1 = B is random.
        document: index (in the store) of the document A came from.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    masked_positions: np.ndarray
    masked_labels: np.ndarray
    next_sentence_label: int
    document: int = -1


def truncate_seq_pair(len_a: int, len_b: int, max_num_tokens: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """Trim a pair to ``max_num_tokens`` tokens in total (reference ``truncate_seq_pair``).

    One token at a time is removed from the longer of the two (B when they tie), from
    the front or the back with equal probability. Works on lengths and returns slice
    bounds instead of popping from lists.

    Returns:
        (a_start, a_end, b_start, b_end): keep ``a[a_start:a_end]`` and ``b[b_start:b_end]``.
    """
    a0, a1, b0, b1 = 0, len_a, 0, len_b
    while (a1 - a0) + (b1 - b0) > max_num_tokens:
        front = rng.random() < 0.5
        if (a1 - a0) > (b1 - b0):
            if front:
                a0 += 1
            else:
                a1 -= 1
        else:
            if front:
                b0 += 1
            else:
                b1 -= 1
    return a0, a1, b0, b1


def create_instances_from_document(
    store: TokenStore,
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: np.random.Generator,
    cls_id: int,
    sep_id: int,
) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Unmasked NSP pairs from one document (reference ``create_instances_from_document``).

    Sentences are accumulated into a chunk until it reaches a target length
    (``max_seq_length - 3``, or with probability ``short_seq_prob`` a length drawn
    uniformly from [2, max_seq_length - 3]) or the document ends. A is the chunk's first
    ``a_end`` sentences (``a_end`` uniform in [1, len(chunk) - 1]); B is the rest of the
    chunk (IsNext, label 0) or, when the chunk has one sentence or with probability 0.5,
    sentences read from a random start in another document until B reaches its target
    length (label 1); the chunk's unused sentences are then put back to start the next
    chunk. The pair is trimmed with ``truncate_seq_pair``.

    Inputs:
        store: the documents (``num_documents >= 2`` for random B to differ).
        document_index: document to read A from, in [0, store.num_documents).
        max_seq_length: T_max >= 5, counting [CLS] and two [SEP].
        short_seq_prob: probability of a short target length.
        rng: the generator every draw comes from.
        cls_id, sep_id: ids of [CLS] and [SEP].
    Returns:
        list of (input_ids (L,) int32, token_type_ids (L,) int8, next_sentence_label),
        with L <= max_seq_length; masking is applied separately.
    Raises:
        ValueError: max_seq_length < 5.
    """
    if max_seq_length < 5:
        raise ValueError(f"max_seq_length must be at least 5, got {max_seq_length}")
    document = store.document(document_index)
    n_docs = store.num_documents
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = int(rng.integers(2, max_num_tokens + 1))

    out = []
    chunk: list[np.ndarray] = []
    chunk_len = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_len += len(document[i])
        if i == len(document) - 1 or chunk_len >= target_seq_length:
            a_end = 1
            if len(chunk) >= 2:
                a_end = int(rng.integers(1, len(chunk)))  # uniform in [1, len(chunk) - 1]
            tokens_a = np.concatenate(chunk[:a_end])
            if len(chunk) == 1 or rng.random() < 0.5:
                label = 1
                target_b_length = target_seq_length - len(tokens_a)
                # Try a few times to pick a document other than this one.
                for _ in range(10):
                    rand_doc = int(rng.integers(0, n_docs))
                    if rand_doc != document_index:
                        break
                start = int(rng.integers(0, store.num_sentences_in(rand_doc)))
                # Sentences from `start` on until B reaches its target length (or the document ends).
                tokens_b = store.read_from(rand_doc, start, target_b_length)
                # Put the chunk's sentences after A back, so they start the next chunk.
                i -= len(chunk) - a_end
            else:
                label = 0
                tokens_b = np.concatenate(chunk[a_end:])
            a0, a1, b0, b1 = truncate_seq_pair(len(tokens_a), len(tokens_b), max_num_tokens, rng)
            la, lb = a1 - a0, b1 - b0
            ids = np.empty(la + lb + 3, dtype=np.int32)
            ids[0] = cls_id
            ids[1 : 1 + la] = tokens_a[a0:a1]
            ids[1 + la] = sep_id
            ids[2 + la : 2 + la + lb] = tokens_b[b0:b1]
            ids[-1] = sep_id
            types = np.zeros(len(ids), dtype=np.int8)
            types[la + 2 :] = 1
            out.append((ids, types, label))
            chunk = []
            chunk_len = 0
        i += 1
    return out


def create_masked_lm_predictions(
    input_ids: np.ndarray,
    vocab: VocabInfo,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    rng: np.random.Generator,
    whole_word_mask: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Choose MLM positions and corrupt them (reference ``create_masked_lm_predictions``).

    ``num_to_predict = min(max_predictions_per_seq, max(1, round(L * masked_lm_prob)))``
    (Python's ``round``, L counts [CLS] and [SEP]). Candidates are all positions except
    [CLS] and [SEP] (and [PAD], should one be present), taken in random order. With
    ``whole_word_mask`` a ``##`` piece belongs to the group of the token just before it
    and groups are masked whole; a group that would overshoot ``num_to_predict`` is
    skipped, as in the reference. (Unlike the reference, a ``##`` piece right after a
    [SEP] starts its own group instead of joining the last word of A.) Each chosen
    position independently becomes [MASK] with probability 0.8, stays unchanged with
    0.1, or becomes a random id from ``vocab.random_ids`` with 0.1.

    Inputs:
        input_ids: (L,) integer ids; not modified.
    Returns:
        output_ids (L,) int32, masked_positions (P,) int32 increasing,
        masked_labels (P,) int32 original ids, with P <= num_to_predict.
    """
    ids = np.asarray(input_ids)
    L = len(ids)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(L * masked_lm_prob))))
    is_cand = (ids != vocab.cls_id) & (ids != vocab.sep_id) & (ids != vocab.pad_id)
    cand = np.flatnonzero(is_cand)
    if whole_word_mask and len(cand):
        # A candidate starts a new group unless it is a ## piece directly after another candidate.
        joins = vocab.is_continuation[ids[cand]]
        joins[0] = False
        joins[1:] &= np.diff(cand) == 1
        group_of = np.cumsum(~joins) - 1                     # group index of each candidate
        sizes = np.bincount(group_of).tolist()
        taken = np.zeros(len(sizes), dtype=bool)
        count = 0
        for g in rng.permutation(len(sizes)).tolist():       # groups in random order
            if count >= num_to_predict:
                break
            if count + sizes[g] > num_to_predict:            # would overshoot: skip this word
                continue
            taken[g] = True
            count += sizes[g]
        positions = cand[taken[group_of]]
    else:
        positions = cand[rng.permutation(len(cand))[:num_to_predict]]

    k = len(positions)
    u = rng.random(k)
    keep_draw = rng.random(k)
    replacement = vocab.random_ids[rng.integers(0, len(vocab.random_ids), size=k)]
    out = ids.astype(np.int32, copy=True)
    new = np.where(u < 0.8, vocab.mask_id, np.where(keep_draw < 0.5, ids[positions], replacement))
    out[positions] = new
    order = np.argsort(positions, kind="stable")
    positions = positions[order].astype(np.int32)
    return out, positions, ids[positions].astype(np.int32)


# ----------------------------------------------------------------------------------------
# Epochs: static (dupe_factor) and dynamic masking, resumable and bounded in memory
# ----------------------------------------------------------------------------------------


def _check_store(store: TokenStore) -> None:
    if store.num_documents < 2:
        raise CorpusError(
            f"the store holds {store.num_documents} document(s); next-sentence prediction needs "
            "at least 2 (separate documents with a blank line)"
        )


def _document_instances(store, vocab, d, seed, pair_copy, mask_copy, max_seq_length,
                        short_seq_prob, masked_lm_prob, max_predictions_per_seq, whole_word_mask,
                        mask: bool = True):
    pair_rng = np.random.default_rng([_TAG_PAIRS, seed, pair_copy, d])
    pairs = create_instances_from_document(store, d, max_seq_length, short_seq_prob, pair_rng,
                                           vocab.cls_id, vocab.sep_id)
    if not mask:
        return pairs
    mask_rng = np.random.default_rng([_TAG_MASKS, seed, mask_copy, d])
    out = []
    for ids, types, label in pairs:
        m_ids, pos, labels = create_masked_lm_predictions(
            ids, vocab, masked_lm_prob, max_predictions_per_seq, mask_rng, whole_word_mask)
        out.append(Instance(m_ids, types, pos, labels, label, d))
    return out


def _check_seed(**values: int) -> None:
    for name, v in values.items():
        if int(v) != v or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")


def _copies(epoch: int, masking: str, dupe_factor: int) -> tuple[int, int]:
    if masking not in ("static", "dynamic"):
        raise ValueError(f"masking must be 'static' or 'dynamic', got {masking!r}")
    if dupe_factor < 1:
        raise ValueError(f"dupe_factor must be >= 1, got {dupe_factor}")
    pair_copy = epoch % dupe_factor
    return pair_copy, (pair_copy if masking == "static" else epoch)


def iterate_instances(
    store: TokenStore,
    vocab: VocabInfo,
    max_seq_length: int,
    epoch: int,
    seed: int,
    *,
    masking: str = "dynamic",
    dupe_factor: int = 10,
    short_seq_prob: float = 0.1,
    masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int = 20,
    whole_word_mask: bool = False,
    shuffle_buffer: int = 10_000,
) -> Iterator[Instance]:
    """Yield one epoch of masked instances, shuffled, generated on the fly from the store.

    What an epoch contains. The reference makes ``dupe_factor`` passes over the
    documents, each cutting them into pairs and masking them afresh, and trains on the
    union. Here epoch ``e`` is pass ``e % dupe_factor``: its pairs are drawn from a
    generator seeded by (seed, e % dupe_factor, document). The masks:

    * ``masking="static"``: also seeded by (seed, e % dupe_factor, document), so there are
      exactly ``dupe_factor`` distinct versions of the data, as in the reference;
    * ``masking="dynamic"``: seeded by (seed, e, document): fresh masks every epoch
      (RoBERTa's dynamic masking), pairs still cycling with ``dupe_factor``.

    Order. Documents are visited in a permutation drawn from (seed, epoch) and their
    instances pass through a shuffle buffer of ``shuffle_buffer`` instances (a random
    slot is emitted and refilled; the remainder is emitted in random order), so memory
    stays at O(shuffle_buffer) instances. The same arguments always yield the same
    sequence.

    Raises:
        CorpusError: fewer than 2 documents.
        ValueError: bad masking mode, dupe_factor < 1 or max_seq_length < 5.
    """
    _check_store(store)
    _check_seed(seed=seed, epoch=epoch)
    pair_copy, mask_copy = _copies(epoch, masking, dupe_factor)
    order_rng = np.random.default_rng([_TAG_ORDER, seed, epoch])
    doc_order = order_rng.permutation(store.num_documents)
    cap = max(1, int(shuffle_buffer))
    buf: list[Instance] = []
    for d in doc_order:
        for inst in _document_instances(store, vocab, int(d), seed, pair_copy, mask_copy, max_seq_length,
                                        short_seq_prob, masked_lm_prob, max_predictions_per_seq,
                                        whole_word_mask):
            if len(buf) < cap:
                buf.append(inst)
                continue
            j = int(order_rng.integers(0, cap))
            yield buf[j]
            buf[j] = inst
    for j in order_rng.permutation(len(buf)):
        yield buf[j]


def count_instances(
    store: TokenStore,
    max_seq_length: int,
    epoch: int,
    seed: int,
    *,
    dupe_factor: int = 10,
    short_seq_prob: float = 0.1,
) -> int:
    """Number of instances ``iterate_instances`` yields for this epoch (pairs only, no masking).

    Depends on ``epoch`` only through ``epoch % dupe_factor``. Takes about half the time
    of generating the epoch; use it to size a learning-rate schedule.
    """
    _check_store(store)
    _check_seed(seed=seed, epoch=epoch)
    pair_copy = epoch % dupe_factor
    n = 0
    for d in range(store.num_documents):
        pair_rng = np.random.default_rng([_TAG_PAIRS, seed, pair_copy, d])
        n += len(create_instances_from_document(store, d, max_seq_length, short_seq_prob, pair_rng, 0, 0))
    return n


@dataclass
class Batch:
    """A padded batch for ``BertForPreTraining`` (Hugging Face argument names).

    Fields (all int64 NumPy arrays):
        input_ids: (B, T) token ids, [PAD] after the end.
        token_type_ids: (B, T) 0 for [CLS] A [SEP], 1 for B [SEP], 0 at padding.
        attention_mask: (B, T) 1 at real tokens, 0 at padding.
        labels: (B, T) original id at masked positions, -100 elsewhere.
        next_sentence_label: (B,) 0 = IsNext, 1 = random B.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    labels: np.ndarray
    next_sentence_label: np.ndarray

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the batch."""
        return int(self.attention_mask.sum())

    @property
    def num_predictions(self) -> int:
        """Masked positions carrying an MLM label."""
        return int((self.labels != IGNORE_INDEX).sum())


def collate(
    instances: Sequence[Instance],
    max_seq_length: int,
    pad_id: int,
    pad_to_multiple_of: int | None = None,
) -> Batch:
    """Pad instances into a :class:`Batch`.

    Inputs:
        instances: 1..B instances, each of length <= max_seq_length.
        max_seq_length: T when ``pad_to_multiple_of`` is None.
        pad_id: id of [PAD].
        pad_to_multiple_of: if set, T = the longest instance rounded up to this multiple,
            capped at max_seq_length.
    Raises:
        ValueError: no instance, or one longer than max_seq_length.
    """
    if not instances:
        raise ValueError("cannot collate an empty list of instances")
    longest = max(len(x.input_ids) for x in instances)
    if longest > max_seq_length:
        raise ValueError(f"an instance has {longest} tokens, over max_seq_length {max_seq_length}")
    if pad_to_multiple_of:
        m = int(pad_to_multiple_of)
        T = min(max_seq_length, -(-longest // m) * m)
    else:
        T = max_seq_length
    B = len(instances)
    input_ids = np.full((B, T), pad_id, dtype=np.int64)
    token_type_ids = np.zeros((B, T), dtype=np.int64)
    attention_mask = np.zeros((B, T), dtype=np.int64)
    labels = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
    nsp = np.empty(B, dtype=np.int64)
    for b, x in enumerate(instances):
        L = len(x.input_ids)
        input_ids[b, :L] = x.input_ids
        token_type_ids[b, :L] = x.token_type_ids
        attention_mask[b, :L] = 1
        labels[b, x.masked_positions] = x.masked_labels
        nsp[b] = x.next_sentence_label
    return Batch(input_ids, token_type_ids, attention_mask, labels, nsp)


def iterate_batches(
    store: TokenStore,
    vocab: VocabInfo,
    batch_size: int,
    max_seq_length: int,
    epoch: int,
    seed: int,
    start_batch: int = 0,
    *,
    masking: str = "dynamic",
    dupe_factor: int = 10,
    short_seq_prob: float = 0.1,
    masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int = 20,
    whole_word_mask: bool = False,
    shuffle_buffer: int = 10_000,
    drop_last: bool = True,
    pad_to_multiple_of: int | None = None,
) -> Iterator[Batch]:
    """Yield the batches of one epoch, starting at batch ``start_batch``; reproducible and resumable.

    The instance stream is ``iterate_instances`` (see there for static vs dynamic
    masking, dupe_factor and shuffling). Batch ``k`` of epoch ``e`` is the same for the
    same arguments, so a run resumed at (e, k) with ``start_batch=k`` sees exactly the
    batches an uninterrupted run would have seen from k on. Resuming replays the
    epoch's instance generation up to that point (no collation), which costs about
    the time of generating those instances.

    Inputs:
        batch_size: B.
        max_seq_length: hard limit on sequence length (T unless ``pad_to_multiple_of``).
        drop_last: drop the last, smaller batch (keeps every batch (B, T)).
    Yields:
        Batch, arrays int64 of shape (B, T) and (B,).
    Raises:
        CorpusError: fewer than 2 documents. ValueError: bad arguments.
    """
    if batch_size < 1 or start_batch < 0:
        raise ValueError(f"need batch_size >= 1 and start_batch >= 0, got {batch_size}, {start_batch}")
    stream = iterate_instances(
        store, vocab, max_seq_length, epoch, seed, masking=masking, dupe_factor=dupe_factor,
        short_seq_prob=short_seq_prob, masked_lm_prob=masked_lm_prob,
        max_predictions_per_seq=max_predictions_per_seq, whole_word_mask=whole_word_mask,
        shuffle_buffer=shuffle_buffer)
    skip = start_batch * batch_size
    for _ in range(skip):
        if next(stream, None) is None:
            return
    pending: list[Instance] = []
    for inst in stream:
        pending.append(inst)
        if len(pending) == batch_size:
            yield collate(pending, max_seq_length, vocab.pad_id, pad_to_multiple_of)
            pending = []
    if pending and not drop_last:
        yield collate(pending, max_seq_length, vocab.pad_id, pad_to_multiple_of)


def make_eval_batches(
    store: TokenStore,
    vocab: VocabInfo,
    batch_size: int,
    max_seq_length: int,
    seed: int,
    *,
    max_instances: int | None = None,
    short_seq_prob: float = 0.1,
    masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int = 20,
    whole_word_mask: bool = False,
    pad_to_multiple_of: int | None = None,
) -> list[Batch]:
    """A fixed evaluation set from held-out documents: the same batches every time.

    One pass over the documents in store order (pairs and masks seeded by ``seed`` and
    the document, no shuffling), cut to ``max_instances`` if given; the last batch may
    be smaller. Build it once and reuse it: the list is held in memory.

    Returns:
        list of Batch; empty when the store holds no document (nothing held out).
    Raises:
        CorpusError: exactly 1 document (NSP needs a second one).
    """
    if store.num_documents == 0:
        return []
    _check_store(store)
    _check_seed(seed=seed)
    insts: list[Instance] = []
    for d in range(store.num_documents):
        insts.extend(_document_instances(store, vocab, d, seed, 0, 0, max_seq_length, short_seq_prob,
                                         masked_lm_prob, max_predictions_per_seq, whole_word_mask))
        if max_instances is not None and len(insts) >= max_instances:
            insts = insts[:max_instances]
            break
    return [collate(insts[i : i + batch_size], max_seq_length, vocab.pad_id, pad_to_multiple_of)
            for i in range(0, len(insts), batch_size)]


# ----------------------------------------------------------------------------------------
# The unigram baseline
# ----------------------------------------------------------------------------------------


def token_counts(store: TokenStore, vocab_size: int, chunk_tokens: int = 1 << 24) -> np.ndarray:
    """Occurrences of every id over the store's documents (no [CLS]/[SEP] added).

    Returns:
        (vocab_size,) int64 counts. Reads memory-mapped tokens in chunks.
    Raises:
        ValueError: a token id >= vocab_size.
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    if store.doc_ids is None:
        ranges = [(0, len(store.tokens))]
    else:
        ranges = [store.token_range(d) for d in range(store.num_documents)]
    for t0, t1 in ranges:
        for c in range(t0, t1, chunk_tokens):
            part = np.asarray(store.tokens[c : min(t1, c + chunk_tokens)])
            if part.size and int(part.max()) >= vocab_size:
                raise ValueError(f"token id {int(part.max())} >= vocab_size {vocab_size}")
            counts += np.bincount(part, minlength=vocab_size)
    return counts


def unigram_cross_entropy(counts: np.ndarray, labels: np.ndarray | Iterable[np.ndarray], smoothing: float = 1.0) -> float:
    """Mean -log p(label) in nats under the unigram distribution of ``counts``.

    This is the loss of a model that ignores context; evaluated on the same masked
    positions as the MLM loss it is the baseline to beat. With ``labels`` drawn from the
    training distribution itself it equals the entropy of that distribution (up to
    smoothing). ``p = (counts + smoothing) / (counts.sum() + smoothing * V)`` so unseen
    ids have finite loss.

    Inputs:
        counts: (V,) token counts (``token_counts``).
        labels: one (..., T) int array or an iterable of them (e.g. each eval batch's
            ``labels``); entries equal to -100 are ignored.
    Returns:
        float, nats per prediction (nan if there is no prediction).
    """
    counts = np.asarray(counts, dtype=np.float64)
    with np.errstate(divide="ignore"):  # unseen ids get -inf only when smoothing == 0
        logp = np.log(counts + smoothing) - math.log(counts.sum() + smoothing * len(counts))
    if isinstance(labels, np.ndarray):
        labels = [labels]
    total, n = 0.0, 0
    for lab in labels:
        lab = np.asarray(lab)
        sel = lab[lab != IGNORE_INDEX]
        total -= float(logp[sel].sum())
        n += sel.size
    return total / n if n else float("nan")
