"""A fine-tuning TSV as a pretraining corpus (``train_mlm.py --corpus train.tsv``): one
document a row, its text column(s) only; the token store cache, held-out documents and
``--exclude-documents`` work on it as on a text file; continued pretraining from a run's
weights on a task's text runs end to end."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert.pretraining.corpus import (CorpusError, build_or_load_store, iter_documents,
                                         split_documents)
from minibert.pretraining.exclusion import DocumentExclusion, document_digest
from minibert.tokenization import BertTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
ROOT = Path(__file__).resolve().parents[1]
MOVIE_TRAIN = ROOT / "data" / "classify" / "en" / "movie_reviews" / "train.tsv"
# texts without the letter q, labels of q's only: a label in the corpus would show
WORDS = "the a film plot is was good bad dull fine slow sharp cast story end music".split()


def write_tsv(path: Path, n: int, pair: bool = False, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    rows = ["label\tsentence_a\tsentence_b" if pair else "label\tsentence"]
    for i in range(n):
        text = [" ".join(rng.choice(WORDS, rng.integers(4, 12))) + "."
                for _ in range(2 if pair else 1)]
        rows.append("\t".join(["qqq" if i % 2 else "qqqq", *text]))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_a_tsv_is_one_document_a_row_without_its_labels(tmp_path):
    single, pair = write_tsv(tmp_path / "s.tsv", 5), write_tsv(tmp_path / "p.tsv", 4, pair=True)
    text = tmp_path / "t.txt"
    text.write_text("one line.\ntwo line.\n\nthird.\n", encoding="utf-8")
    docs = list(iter_documents([single, text, pair]))
    rows = [l.split("\t") for l in single.read_text(encoding="utf-8").splitlines()[1:]]
    prow = [l.split("\t") for l in pair.read_text(encoding="utf-8").splitlines()[1:]]
    assert docs == ([[r[1]] for r in rows] + [["one line.", "two line."], ["third."]]
                    + [[r[1], r[2]] for r in prow])
    assert not any("q" in s for d in docs for s in d)
    # the shipped task: one document per row of train.tsv
    shipped = list(iter_documents([MOVIE_TRAIN]))
    assert len(shipped) == len(MOVIE_TRAIN.read_text(encoding="utf-8").strip().splitlines()) - 1
    assert all(len(d) == 1 for d in shipped)


@pytest.mark.parametrize("content,says", [
    ("text\n", "s.tsv:1: header must be"), ("label\tsentence\n0\t\n", "s.tsv:2: empty sentence"),
    ("label\tsentence\n", "empty split")])
def test_a_malformed_tsv_is_a_corpus_error_naming_the_line(content, says, tmp_path):
    bad = tmp_path / "s.tsv"
    bad.write_text(content, encoding="utf-8")
    with pytest.raises(CorpusError, match=says):
        list(iter_documents([bad]))


def test_the_token_store_cache_exclusion_and_held_out_split_on_a_tsv(tmp_path):
    tsv = write_tsv(tmp_path / "s.tsv", 40)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS])
                     + "\n", encoding="utf-8")
    tok = BertTokenizer(vocab)
    docs = list(iter_documents([tsv]))
    listed = tmp_path / "exclude.tsv"
    listed.write_text(f"{document_digest(docs[3])}\trow 4\n", encoding="utf-8")
    exclude = DocumentExclusion.read([str(listed)])
    store = build_or_load_store([tsv], tok, tmp_path / "cache", show_progress=False,
                                exclude=exclude)
    assert store.num_documents == 39 and len(exclude.left_out) == 1
    kept = [d for i, d in enumerate(docs) if i != 3]
    for i in (0, 3, 38):
        want = tok.convert_tokens_to_ids(tok.tokenize(kept[i][0]))
        assert store.document(i)[0].tolist() == want and tok.unk_token_id not in want
    mtime = (tmp_path / "cache" / "store.json").stat().st_mtime_ns
    again = build_or_load_store([tsv], tok, tmp_path / "cache", show_progress=False,
                                exclude=DocumentExclusion.read([str(listed)]))
    assert (tmp_path / "cache" / "store.json").stat().st_mtime_ns == mtime   # reused
    np.testing.assert_array_equal(again.tokens, store.tokens)
    write_tsv(tsv, 30, seed=1)                                   # new text: rebuilt
    assert build_or_load_store([tsv], tok, tmp_path / "cache", show_progress=False
                               ).num_documents == 30
    train, held = split_documents(store, 0.25, seed=0)
    assert train.num_documents + held.num_documents == 39 and held.num_documents >= 1


def test_continued_pretraining_on_a_task_tsv_from_a_run(tmp_path, capsys):
    """The recipe of docs/finetuning.md ("Pretraining on your own text"), tiny: a run on
    a TSV learns its vocab from the text column (no label in it), and a second run starts
    from its weights on the same TSV, keeping the vocab."""
    import train_mlm
    tsv = write_tsv(tmp_path / "train.tsv", 60)
    small = ["--hidden-size", "32", "--num-hidden-layers", "1", "--num-attention-heads", "2",
             "--intermediate-size", "64", "--max-seq-length", "32", "--batch-size", "4",
             "--eval-fraction", "0.1", "--eval-instances", "8", "--no-progress",
             "--exclude-documents", "none"]
    first, more = tmp_path / "first", tmp_path / "more"
    assert train_mlm.main(["--corpus", str(tsv), "--vocab-size", "120", "--max-steps", "2",
                           "--output-dir", str(first), *small]) == 0
    vocab = (first / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert "film" in vocab and not any("q" in t for t in vocab if not t.startswith("["))
    assert not any("label" in t for t in vocab)
    capsys.readouterr()
    assert train_mlm.main(["--corpus", str(tsv), "--init-checkpoint", str(first),
                           "--objective", "mlm", "--max-steps", "3", "--lr", "5e-5",
                           "--output-dir", str(more), *small]) == 0
    out = capsys.readouterr().out
    assert "weights from" in out
    assert (more / "vocab.txt").read_bytes() == (first / "vocab.txt").read_bytes()
    summary = json.loads((more / "summary.json").read_text(encoding="utf-8"))
    assert summary
