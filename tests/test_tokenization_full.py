"""Full-corpus parity with transformers' Python BertTokenizer (slow: ~2 min on 2 cores).

Every line of ../shared/data/pretrain/en/*.txt (bert-base-uncased vocab, lower case) and
of ../shared/data/pretrain/zh/peoples_daily_199801.txt and classify/zh/*/*.tsv
(bert-base-chinese vocab, do_lower_case True and False) must give the same tokens and
the same ``encode`` ids. The reference ids are ``[CLS] + convert_tokens_to_ids(tokenize)
+ [SEP]``, which is what its ``encode`` computes, so the slow reference runs once per line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from minibert.tokenization import BertTokenizer

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data not found at {SHARED} (clone with shared/ beside)"),
]


def reference_class():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

        return BertTokenizerLegacy
    except ImportError:
        from transformers import BertTokenizer as Ref

        return Ref


def _files(kind: str) -> list[Path]:
    if kind == "en":
        return sorted((SHARED / "pretrain" / "en").glob("*.txt"))
    return [SHARED / "pretrain" / "zh" / "peoples_daily_199801.txt"] + sorted(
        (SHARED / "classify" / "zh").glob("*/*.tsv")
    )


CASES = [
    ("en", "bert-base-uncased-vocab.txt", True),
    ("zh", "bert-base-chinese-vocab.txt", True),
    ("zh", "bert-base-chinese-vocab.txt", False),
]


@pytest.mark.parametrize("kind,vocab,lower", CASES, ids=["en-uncased", "zh-lower", "zh-cased"])
def test_full_file_parity(kind, vocab, lower):
    vocab_file = SHARED / "vocab" / vocab
    ours = BertTokenizer(vocab_file, do_lower_case=lower)
    ref = reference_class()(str(vocab_file), do_lower_case=lower)
    files = _files(kind)
    assert files, f"no {kind} files under {SHARED}"
    n_lines = 0
    for path in files:
        lines = path.read_text(encoding="utf-8").split("\n")
        for i, line in enumerate(lines):
            want = ref.tokenize(line)
            got = ours.tokenize(line)
            if got != want:
                pytest.fail(f"{path.name}:{i + 1} tokenize differs\n{line!r}\nours {got}\nref  {want}")
            want_ids = ref.build_inputs_with_special_tokens(ref.convert_tokens_to_ids(want))
            got_ids = ours.encode(line)
            if got_ids != want_ids:
                pytest.fail(f"{path.name}:{i + 1} encode differs\n{line!r}\nours {got_ids}\nref  {want_ids}")
        n_lines += len(lines)
    assert n_lines > 10_000
