"""What the model guesses while it learns: a few fixed held-out sentences with one word
masked, filled at every evaluation, so a learner sees the predictions go from frequent
tokens ("the , .") to words that fit (as nanoGPT prints samples of its text)."""
from __future__ import annotations

import numpy as np

from .corpus import TokenStore


def pick_samples(store: TokenStore, tokenizer, n: int = 3, seed: int = 0,
                 max_tokens: int = 40) -> list[tuple[list[int], int]]:
    """Up to ``n`` held-out sentences with one word masked: ``([CLS] ids [SEP], position of
    the [MASK])`` each, the original id at that position replaced by ``mask_token_id``.

    A sentence qualifies with 6 to ``max_tokens - 2`` pieces; the masked word is a
    whole-word piece of letters (not a ``##`` piece, not followed by one, not special),
    drawn with ``seed``. Sentences are taken in a seeded order, so the same run shows the
    same samples at every evaluation and after a resume.
    """
    rng = np.random.default_rng(seed)
    specials = set(tokenizer.all_special_ids)
    picked: list[tuple[list[int], int]] = []
    for s in rng.permutation(len(store.sentence_offsets) - 1):
        a, b = int(store.sentence_offsets[s]), int(store.sentence_offsets[s + 1])
        ids = [int(i) for i in store.tokens[a:b]]
        if not 6 <= len(ids) <= max_tokens - 2:
            continue
        toks = tokenizer.convert_ids_to_tokens(ids)
        ok = [t for t, tok in enumerate(toks)
              if tok.isalpha() and ids[t] not in specials
              and not (t + 1 < len(toks) and toks[t + 1].startswith("##"))]
        if not ok:
            continue
        t = int(rng.choice(ok))
        row = [tokenizer.cls_token_id, *ids, tokenizer.sep_token_id]
        row[t + 1] = tokenizer.mask_token_id
        picked.append((row, ids[t]))
        if len(picked) == n:
            break
    return picked


class MaskSamples:
    """Fill the masks of :func:`pick_samples`' sentences with ``model`` (a
    :class:`~minibert.modeling.BertForPreTraining`, in the caller's mode).

    Calling it returns one dict per sentence: ``text`` (the sentence with ``[MASK]``),
    ``answer`` (the masked word) and ``top`` (``[token, probability]`` pairs, most probable
    first); :meth:`lines` formats them for the log.
    """

    def __init__(self, model, tokenizer, samples: list[tuple[list[int], int]], top_k: int = 3):
        from ..pipelines import FillMaskPipeline
        self.pipe = FillMaskPipeline(model, tokenizer, batch_size=max(len(samples), 1))
        self.tokenizer, self.samples, self.top_k = tokenizer, samples, top_k

    def __call__(self) -> list[dict]:
        if not self.samples:
            return []
        filled = self.pipe.fill_ids([row for row, _ in self.samples], self.top_k)
        decode = self.tokenizer.decode
        return [{"text": decode(row[1:-1]), "answer": decode([answer]),
                 "top": [[r["token_str"], round(r["score"], 4)] for r in result]}
                for (row, answer), result in zip(self.samples, filled)]

    @staticmethod
    def lines(samples: list[dict]) -> list[str]:
        """``  TEXT -> tok p | tok p ... (was: WORD)`` per sample."""
        return [f"  {s['text']} -> " + " | ".join(f"{t} {p:.2f}" for t, p in s["top"])
                + f" (was: {s['answer']})" for s in samples]
