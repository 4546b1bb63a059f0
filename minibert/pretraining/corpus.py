"""The pretraining corpus: reading text files and a compact, memory-mappable token store.

The reading half of google-research/bert ``create_training_instances``: one sentence per
line, a blank line between documents, every line WordPiece-tokenized. Unlike the
reference, which holds every instance of every ``dupe_factor`` copy in memory, the corpus
is tokenized once into a :class:`TokenStore`: one flat int32 array of token ids plus two
int64 offset arrays (sentence starts and document starts), about 4 bytes per token. It can
be saved as ``.npy`` files and memory-mapped back (``load_store``), so a large corpus is
tokenized once; instances are cut from it on the fly (:mod:`.batches`).

Also here: the held-out split by whole documents and the unigram baseline (the loss of a
model that ignores context).

Shape legend: N = tokens in the store, S = sentences, D = documents, V = vocabulary size,
P = prediction slots per sequence.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import warnings
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from .. import derived
from ..atomic import atomic_write
from ..nn.losses import IGNORE_INDEX
from ..textfiles import utf8_lines
from .errors import CorpusError
from .exclusion import DocumentExclusion
from .tsv_text import TSV_SUFFIX, tsv_documents

_TAG_SPLIT = 404  # first word of the SeedSequence entropy of the held-out split
_STORE_FORMAT = 1


def check_seed(**values: int) -> None:
    """Raises ValueError unless every value is a non-negative integer (seeds, epochs)."""
    for name, v in values.items():
        if int(v) != v or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")


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


def iter_documents(files: Sequence[str | os.PathLike], progress: tqdm | None = None,
                   exclude: DocumentExclusion | None = None) -> Iterator[list[str]]:
    """Stream documents from corpus files: one sentence per line, blank line between documents.

    As ``create_training_instances`` in the reference, each line is stripped, a blank
    line closes the current document and empty documents are dropped. Unlike the
    reference, the end of a file also closes a document (the reference would glue the
    last document of one file to the first of the next when a file lacks a final blank
    line). A UTF-8 byte-order mark at the start of a file is dropped. A ``.tsv`` file is
    a fine-tuning TSV, one document a row (:func:`~.tsv_text.tsv_documents`; labels unread).

    Inputs:
        files: paths of UTF-8 text files (see ``resolve_corpus_files``).
        progress: optional tqdm bar counting bytes; updated per line.
        exclude: documents to leave out (:class:`~.exclusion.DocumentExclusion`, which
            notes those it meets), or None.
    Yields:
        list[str]: the stripped, non-empty sentences of one document.
    Raises:
        CorpusError: a file is missing, or a line is not valid UTF-8 (the message gives
            the file, the 1-based line number and the byte offset within the line).
    """
    for path in files:
        path = Path(path)
        if not path.is_file():
            raise CorpusError(f"corpus file not found: {path}")
        if path.suffix.lower() == TSV_SUFFIX:
            yield from tsv_documents(path, progress, exclude)
            continue
        doc: list[str] = []
        for _, line in utf8_lines(path, error=CorpusError,
                                  on_bytes=None if progress is None else progress.update):
            line = line.strip()
            if line:
                doc.append(line)
            elif doc:
                if exclude is None or exclude.keep(doc):
                    yield doc
                doc = []
        if doc and (exclude is None or exclude.keep(doc)):
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
    min_documents: int = 1,
    exclude: DocumentExclusion | None = None,
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
        min_documents: fewer documents than this is an error; pass the objective's
            ``Objective.min_documents`` (2 for next-sentence prediction).
        exclude: documents left out (see :func:`iter_documents`), or None.
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
    empty_files = []
    with tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing corpus",
              disable=not show_progress) as bar:
        for f in files:
            docs = iter_documents([f], progress=bar, exclude=exclude)
            if not _tokenize_documents(docs, tokenizer, tokens, sent_ends, doc_ends):
                empty_files.append(f)
    n_docs = len(doc_ends) - 1
    if n_docs == 0:
        names = ", ".join(str(f) for f in files)
        raise CorpusError(f"the corpus is empty: no tokenizable text in {names}")
    for f in empty_files:
        warnings.warn(f"corpus file {f} holds no text; skipped", stacklevel=2)
    _check_documents(n_docs, min_documents, files)
    return TokenStore(
        np.frombuffer(tokens, dtype=np.intc).astype(np.int32),
        np.frombuffer(sent_ends, dtype=np.int64).copy(),
        np.frombuffer(doc_ends, dtype=np.int64).copy(),
    )


def _tokenize_documents(documents: Iterable[list[str]], tokenizer, tokens: array,
                        sent_ends: array, doc_ends: array) -> bool:
    """Append the ids of every non-empty line of ``documents`` to ``tokens``, the end of
    each such line (tokens so far) to ``sent_ends`` and the end of each document left
    non-empty (sentences so far) to ``doc_ends``. Returns whether a document was added."""
    before = len(doc_ends)
    for doc in documents:
        n_sent = 0
        for line in doc:
            ids = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(line))
            if not ids:
                continue
            tokens.extend(ids)
            sent_ends.append(len(tokens))
            n_sent += 1
        if n_sent:
            doc_ends.append(doc_ends[-1] + n_sent)
    return len(doc_ends) > before


def _check_documents(n_docs: int, min_documents: int, files: Sequence[Path]) -> None:
    if n_docs < min_documents:
        names = ", ".join(str(f) for f in files)
        raise CorpusError(
            f"the corpus ({names}) holds {n_docs} document(s) but at least {min_documents} "
            "are needed for this objective: documents are separated by a blank line. "
            "Insert blank lines between documents."
        )


_STORE_FILES = ("tokens.npy", "sentence_offsets.npy", "document_offsets.npy")


def save_store(store: TokenStore, directory: str | os.PathLike, meta: Mapping | None = None) -> Path:
    """Write a store as ``tokens.npy``, ``sentence_offsets.npy``, ``document_offsets.npy``, ``store.json``.

    A view (``doc_ids`` set) is compacted first. Every file is written atomically
    (:func:`minibert.atomic.atomic_write`), the old ``store.json`` is removed first and the
    new one written last, so a crash never leaves a directory that ``load_store`` accepts
    with mismatched arrays. ``store.json`` records the size and SHA-256 of each array file
    (``"files"``, :func:`minibert.derived.digest`) and the SHA-256 of its own other
    content (``"sha256"``), which :func:`load_store` checks.

    Returns:
        the directory as a ``Path``.
    Raises:
        OSError: the directory cannot be written.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    store = store.compact()
    (out / "store.json").unlink(missing_ok=True)
    files = {}
    for name, arr in zip(_STORE_FILES, (store.tokens, store.sentence_offsets, store.document_offsets)):
        atomic_write(out / name, lambda fh, arr=arr: np.save(fh, np.ascontiguousarray(arr)))
        files[name] = derived.digest(out / name)
    info = {
        "format": _STORE_FORMAT,
        "num_tokens": store.num_tokens,
        "num_sentences": store.num_sentences,
        "num_documents": store.num_documents,
        "files": files,
        "meta": dict(meta or {}),
    }
    _write_store_info(out, info)
    return out


def _info_sha256(info: Mapping) -> str:
    """The SHA-256 of ``store.json``'s content but its own ``"sha256"`` entry (canonical
    JSON: sorted keys, no spaces)."""
    body = {k: v for k, v in info.items() if k != "sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _write_store_info(out: Path, info: dict) -> None:
    """``store.json``, atomically, with the SHA-256 of its own content (``"sha256"``)."""
    info = {**info, "sha256": _info_sha256(info)}
    data = json.dumps(info, indent=1).encode("utf-8")
    atomic_write(out / "store.json", lambda fh: fh.write(data))


class DamagedStoreError(CorpusError):
    """A token store whose files fail their check (:func:`load_store`): damaged bytes,
    truncated, missing or empty files, or arrays that disagree."""


def _read_store_info(d: Path) -> dict:
    marker = d / "store.json"
    if not marker.is_file():
        raise DamagedStoreError(f"{d} holds no complete token store (store.json missing)")
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError):
        raise DamagedStoreError(f"{marker} cannot be read (damaged)") from None
    if not isinstance(info, dict):
        raise DamagedStoreError(f"{marker} is damaged (not a JSON object)")
    if "sha256" in info and info["sha256"] != _info_sha256(info):
        raise DamagedStoreError(f"{marker} does not match its recorded SHA-256 (damaged bytes)")
    return info


def load_store(directory: str | os.PathLike, mmap: bool = True,
               vocab_size: int | None = None) -> TokenStore:
    """Load a store written by ``save_store``; arrays memory-mapped read-only when ``mmap``.

    What is checked before the store is used:
        * ``store.json`` against its own recorded SHA-256, then every array file
          against the size and SHA-256 that ``store.json`` records
          (:func:`minibert.derived.check`): missing, empty, truncated or damaged files;
          (a store written before those records, without ``"files"`` in ``store.json``,
          gets the checks below only);
        * the structure: array types and shapes, the counts of ``store.json``, offsets
          that start at 0, rise strictly and end at the token and sentence counts;
        * with ``vocab_size``: every token id in ``[0, vocab_size)`` (one pass over the
          tokens).

    Raises:
        DamagedStoreError (a CorpusError): a file is missing or fails a check, the format
            is unknown, or the arrays disagree; the message names the file.
    """
    d = Path(directory)
    info = _read_store_info(d)
    if info.get("format") != _STORE_FORMAT:
        raise DamagedStoreError(f"{d / 'store.json'}: unknown store format "
                                f"{info.get('format')!r}")
    records = info.get("files")
    arrs = []
    for name in _STORE_FILES:
        p = d / name
        if records is not None:
            problem = derived.check(p, records.get(name) if isinstance(records, dict) else None)
            if problem:
                raise DamagedStoreError(f"token store file {p} {problem}")
        elif not p.is_file():
            raise DamagedStoreError(f"token store file {p} is missing")
        try:
            arrs.append(np.load(p, mmap_mode="r" if mmap else None, allow_pickle=False))
        except (ValueError, OSError, EOFError) as e:
            raise DamagedStoreError(f"token store file {p} cannot be read ({e})") from None
    _check_store_arrays(d, info, *arrs, vocab_size=vocab_size)
    return TokenStore(*arrs)


def _check_store_arrays(d: Path, info: dict, tokens, sent, docs,
                        vocab_size: int | None) -> None:
    """The structure of a store's arrays: dtypes, shapes, counts of ``info``, offsets from
    0 rising strictly to the token and sentence counts; ids in ``[0, vocab_size)``."""
    def bad(why: str):
        return DamagedStoreError(f"token store in {d} is inconsistent ({why})")
    if tokens.dtype != np.int32 or sent.dtype != np.int64 or docs.dtype != np.int64:
        raise bad("array types")
    if tokens.ndim != 1 or sent.ndim != 1 or docs.ndim != 1 or len(sent) < 2 or len(docs) < 2:
        raise bad("array shapes")
    if (len(tokens) != info.get("num_tokens") or len(sent) - 1 != info.get("num_sentences")
            or len(docs) - 1 != info.get("num_documents")):
        raise bad("sizes differ from store.json")
    s, dd = np.asarray(sent), np.asarray(docs)
    if s[0] != 0 or s[-1] != len(tokens) or np.any(np.diff(s) <= 0):
        raise bad("sentence offsets")
    if dd[0] != 0 or dd[-1] != len(sent) - 1 or np.any(np.diff(dd) <= 0):
        raise bad("document offsets")
    if vocab_size is not None:
        for c in range(0, len(tokens), 1 << 24):
            part = np.asarray(tokens[c : c + (1 << 24)])
            if not part.size:
                continue
            low, high = int(part.min()), int(part.max())
            if low < 0 or high >= vocab_size:
                raise bad(f"token id {high if high >= vocab_size else low} outside the "
                          f"vocabulary of {vocab_size}")


def _fingerprint(files: Sequence[Path], tokenizer, exclude: DocumentExclusion | None) -> str:
    h = hashlib.sha256()
    if exclude is not None and exclude.listed:
        h.update(f"exclude {exclude.key}\n".encode())
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
    min_documents: int = 1,
    exclude: DocumentExclusion | None = None,
) -> TokenStore:
    """``build_store`` once, then reuse the memory-mapped copy in ``cache_dir``.

    The cache is keyed by the corpus files (path, size, mtime), the tokenizer (its
    vocab and how it tokenizes a probe string) and the documents ``exclude`` lists; a
    mismatch rebuilds it. The documents left out are kept with the cache and put back
    into ``exclude.left_out`` when it is reused.

    A cache is reused only when :func:`load_store` finds its files as ``store.json``
    records them and every token id inside the tokenizer's vocabulary; a damaged cache
    (flipped bytes, truncated, missing or empty files, a ``store.json`` that cannot be
    read) is rebuilt from the corpus, with a ``note:`` line on stderr naming what was
    wrong. A cache written before the records is checked for what can be checked
    (:func:`load_store`) and then given its records.

    Returns:
        TokenStore, memory-mapped from ``cache_dir``.
    Raises:
        CorpusError: as ``build_store``, also for a cached store with fewer than
            ``min_documents`` documents.
    """
    files = resolve_corpus_files(paths)
    key = _fingerprint(files, tokenizer, exclude)
    cdir = Path(cache_dir)
    vocab = getattr(tokenizer, "vocab", None)
    vocab_size = max(vocab.values()) + 1 if vocab else None
    if (cdir / "store.json").exists() or any((cdir / n).exists() for n in _STORE_FILES):
        try:
            info = _read_store_info(cdir)
            meta = info.get("meta", {})
            if isinstance(meta, dict) and meta.get("fingerprint") == key:
                store = load_store(cdir, vocab_size=vocab_size)
                _check_documents(store.num_documents, min_documents, files)
                if "files" not in info:   # written before the records: give it them
                    info["files"] = {n: derived.digest(cdir / n) for n in _STORE_FILES}
                    _write_store_info(cdir, info)
                if exclude is not None:
                    exclude.left_out = dict(meta.get("left_out", {}))
                return store
        except DamagedStoreError as e:
            print(f"note: the cached token store is damaged: {e}; rebuilding it from the "
                  "corpus", file=sys.stderr)
        except (ValueError, OSError, TypeError, AttributeError):
            pass                  # e.g. too few documents for this objective: rebuilt
    store = build_store(files, tokenizer, show_progress=show_progress,
                        min_documents=min_documents, exclude=exclude)
    save_store(store, cdir, meta={"fingerprint": key, "files": [str(f) for f in files],
                                  "left_out": dict(exclude.left_out) if exclude else {}})
    return load_store(cdir, vocab_size=vocab_size)


def split_documents(
    store: TokenStore,
    eval_fraction: float | None = None,
    eval_documents: int | None = None,
    seed: int = 0,
    min_documents: int = 1,
) -> tuple[TokenStore, TokenStore]:
    """Hold out whole documents for evaluation: a deterministic split by ``seed``.

    Give exactly one of ``eval_fraction`` (rounded, at least ``min_documents`` when > 0)
    or ``eval_documents``. The held-out documents are drawn by a permutation seeded
    with ``seed``; both halves keep the store's document order and are views (no copy).
    ``min_documents`` is the objective's ``Objective.min_documents`` (2 for next-sentence
    prediction, which draws random B sentences from another document of the same half).

    Returns:
        (train_store, eval_store).
    Raises:
        ValueError: both or neither of eval_fraction / eval_documents, or out of range.
        CorpusError: either half would hold fewer than ``min_documents`` documents (an
            empty held-out half is allowed).
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
        raise CorpusError(f"{n_eval} held-out document(s); at least {min_documents} are needed for this objective")
    if D - n_eval < min_documents:
        raise CorpusError(
            f"the corpus has {D} documents; holding out {n_eval} leaves {D - n_eval} for training, "
            f"at least {min_documents} are needed (documents are separated by a blank line; "
            f"--eval-fraction 0 holds none out)"
        )
    check_seed(seed=seed)
    perm = np.random.default_rng([_TAG_SPLIT, seed]).permutation(D)
    eval_ids = np.sort(perm[:n_eval])
    train_ids = np.sort(perm[n_eval:])
    return store.subset(train_ids), store.subset(eval_ids)


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


def unigram_cross_entropy(
    counts: np.ndarray,
    labels: np.ndarray | Iterable[np.ndarray],
    weights: np.ndarray | Iterable[np.ndarray] | None = None,
    smoothing: float = 1.0,
) -> float:
    """Mean -log p(label) in nats under the unigram distribution of ``counts``.

    This is the loss of a model that ignores context; evaluated on the same masked
    positions as the MLM loss it is the baseline to beat. With ``labels`` drawn from the
    training distribution itself it equals the entropy of that distribution (up to
    smoothing). ``p = (counts + smoothing) / (counts.sum() + smoothing * V)`` so unseen
    ids have finite loss.

    Inputs:
        counts: (V,) token counts (``token_counts``).
        labels: one int array or an iterable of them: each batch's ``masked_lm_ids``
            (B, P), or dense (B, T) labels with -100 where nothing is predicted.
        weights: matching ``masked_lm_weights`` (B, P) (an array or an iterable, paired
            with ``labels``): only slots of weight > 0 count. None: every entry other than
            -100 counts.
    Returns:
        float, nats per prediction (nan if there is no prediction).
    Raises:
        ValueError: ``labels`` and ``weights`` hold different numbers of arrays or shapes.
    """
    counts = np.asarray(counts, dtype=np.float64)
    with np.errstate(divide="ignore"):  # unseen ids get -inf only when smoothing == 0
        logp = np.log(counts + smoothing) - math.log(counts.sum() + smoothing * len(counts))
    labels = [labels] if isinstance(labels, np.ndarray) else list(labels)
    if weights is None:
        weights = [None] * len(labels)
    else:
        weights = [weights] if isinstance(weights, np.ndarray) else list(weights)
    if len(weights) != len(labels):
        raise ValueError(f"{len(labels)} label arrays but {len(weights)} weight arrays")
    total, n = 0.0, 0
    for lab, w in zip(labels, weights):
        lab = np.asarray(lab)
        if w is None:
            sel = lab[lab != IGNORE_INDEX]
        else:
            w = np.asarray(w)
            if w.shape != lab.shape:
                raise ValueError(f"weights of shape {w.shape} for labels of shape {lab.shape}")
            sel = lab[w > 0]
        total -= float(logp[sel].sum())
        n += sel.size
    return total / n if n else float("nan")
