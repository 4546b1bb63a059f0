"""Large parity run with transformers' Python BertTokenizer (slow: about a minute on 2 cores).

The corpus is built from what the repository ships (``tests/data/tokenization``): every
line of the English and Chinese samples; every token of the bert-base-uncased and
bert-base-chinese vocabularies as a line of its own, upper-cased and title-cased (about
51k strings over many scripts, ``##`` pieces, ``[unusedN]`` and U+2028 included); and
seeded random lines of vocabulary tokens, some glued into words no vocabulary holds, in
random case. For the bert-base-uncased vocab (lower case) and the bert-base-chinese vocab
(``do_lower_case`` True and False) every line must give the same tokens and the same
``encode`` ids. The reference ids are ``[CLS] + convert_tokens_to_ids(tokenize) + [SEP]``,
which is what its ``encode`` computes, so the slow reference runs once per line.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from minibert.tokenization import BertTokenizer, read_vocab_tokens

DATA = Path(__file__).resolve().parent / "data" / "tokenization"
EN_VOCAB = DATA / "bert-base-uncased-vocab.txt"
ZH_VOCAB = DATA / "bert-base-chinese-vocab.txt"

pytestmark = pytest.mark.slow


def reference_class():
    import transformers  # a test dependency: fail, never skip, when it is missing

    transformers.logging.set_verbosity_error()
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

        return BertTokenizerLegacy
    except ImportError:
        from transformers import BertTokenizer as Ref

        return Ref


def _random_lines(tokens: list[str], n: int, seed: int) -> list[str]:
    """``n`` lines of 1-12 vocabulary tokens (``##`` dropped half the time), joined by a
    space or glued, each line in lower, upper, title or unchanged case."""
    rng = random.Random(seed)
    cases = (str, str.lower, str.upper, str.title)
    lines = []
    for _ in range(n):
        words = rng.choices(tokens, k=rng.randint(1, 12))
        words = [w[2:] if w.startswith("##") and rng.random() < 0.5 else w for w in words]
        sep = rng.choice((" ", " ", ""))
        lines.append(rng.choice(cases)(sep.join(words)))
    return lines


def _corpus() -> list[tuple[str, list[str]]]:
    """[(source name, lines)] for every part of the corpus described in the module docstring."""
    parts = []
    for sample in ("en_sample.txt", "zh_sample.txt"):
        parts.append((sample, (DATA / sample).read_text(encoding="utf-8").split("\n")))
    for vocab in (EN_VOCAB, ZH_VOCAB):
        tokens = read_vocab_tokens(vocab)
        parts.append((f"{vocab.name} tokens", [v for t in tokens for v in (t, t.upper(), t.title())]))
        parts.append((f"{vocab.name} random lines", _random_lines(tokens, 10_000, seed=len(tokens))))
    return parts


CASES = [(EN_VOCAB, True), (ZH_VOCAB, True), (ZH_VOCAB, False)]


@pytest.mark.parametrize("vocab_file,lower", CASES, ids=["en-uncased", "zh-lower", "zh-cased"])
def test_full_parity(vocab_file, lower):
    ours = BertTokenizer(vocab_file, do_lower_case=lower)
    ref = reference_class()(str(vocab_file), do_lower_case=lower)
    n_lines = 0
    for source, lines in _corpus():
        for i, line in enumerate(lines):
            want = ref.tokenize(line)
            got = ours.tokenize(line)
            if got != want:
                pytest.fail(f"{source} line {i + 1}: tokenize differs\n{line!r}\nours {got}\nref  {want}")
            want_ids = ref.build_inputs_with_special_tokens(ref.convert_tokens_to_ids(want))
            got_ids = ours.encode(line)
            if got_ids != want_ids:
                pytest.fail(f"{source} line {i + 1}: encode differs\n{line!r}\nours {got_ids}\nref  {want_ids}")
        n_lines += len(lines)
    assert n_lines > 150_000
