"""Linear probes: multinomial logistic regression on fixed features, for the evaluation
harness (``evaluate.py``): frozen, mean-pooled BERT states (a "probe" in the sense of
Alain & Bengio 2016 / Conneau et al. 2018) and a bag-of-words baseline.

The classifier is our own (L2-regularised softmax regression, fitted by SciPy's L-BFGS on
the exact loss and gradient), so the run time needs no scikit-learn. Shape legend: N rows,
D features, K classes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.optimize
import scipy.sparse

from ..backend import to_numpy
from ..nn import mean_pooling_forward
from ..tokenization.basic import BasicTokenizer


def softmax_regression_loss(params: np.ndarray, X, y: np.ndarray, K: int, l2: float
                            ) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of softmax(X W + b) plus (l2 / 2) ||W||^2, and its gradient.

    Args:
        params: (D*K + K,) float64, W (D, K) row-major then b (K,).
        X: (N, D) float64 array or SciPy sparse matrix. y: (N,) int class ids in [0, K).
        l2: the weight of the L2 penalty on W (not on b), >= 0.
    Returns:
        (loss, gradient (D*K + K,)).
    """
    N, D = X.shape
    W, b = params[:D * K].reshape(D, K), params[D * K:]
    z = np.asarray(X @ W) + b                                        # (N, K)
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))          # log softmax
    loss = -logp[np.arange(N), y].mean() + 0.5 * l2 * float((W * W).sum())
    # forward: loss = -mean log softmax(X W + b)[y] + l2/2 |W|^2
    dz = np.exp(logp)
    dz[np.arange(N), y] -= 1.0
    dz /= N                                                          # (N, K)
    dW = np.asarray(X.T @ dz) + l2 * W                               # (D, K)
    return loss, np.concatenate([dW.ravel(), dz.sum(axis=0)])


@dataclass
class LinearProbe:
    """A fitted softmax regression: ``W`` (D, K), ``b`` (K,), its ``l2``, and the feature
    scaling (``mean``, ``scale``, (D,)) learned on the train rows (None for sparse
    features)."""

    W: np.ndarray
    b: np.ndarray
    l2: float
    mean: np.ndarray | None = None
    scale: np.ndarray | None = None

    def predict(self, X) -> np.ndarray:
        """(N,) predicted class ids of the rows of X (N, D)."""
        if self.mean is not None:
            X = (X - self.mean) / self.scale
        return np.asarray(X @ self.W + self.b).argmax(axis=1)


def fit_probe(X_train, y_train: np.ndarray, X_dev, y_dev: np.ndarray, K: int,
              l2_grid: Sequence[float] = (1e-4, 1e-3, 1e-2, 1e-1), max_iter: int = 500
              ) -> tuple[LinearProbe, float]:
    """Fit softmax regression for each L2 weight in ``l2_grid``; keep the best on dev.

    Dense features are standardised with the train rows' mean and standard deviation.
    Args:
        X_train: (N, D) dense float array or sparse matrix; y_train (N,) ids in [0, K).
        X_dev, y_dev: the rows that pick the L2 weight.
    Returns:
        (probe, dev accuracy).
    Raises:
        ValueError: labels outside [0, K), or no train rows.
    """
    y_train, y_dev = np.asarray(y_train), np.asarray(y_dev)
    if len(y_train) == 0:
        raise ValueError("fit_probe: no train rows")
    if y_train.min() < 0 or max(y_train.max(), y_dev.max(initial=0)) >= K:
        raise ValueError(f"fit_probe: labels must be in [0, {K})")
    mean = scale = None
    if not scipy.sparse.issparse(X_train):
        X_train = np.asarray(X_train, dtype=np.float64)
        mean, scale = X_train.mean(axis=0), X_train.std(axis=0) + 1e-8
        X_train = (X_train - mean) / scale
    else:
        X_train = X_train.astype(np.float64)
    D = X_train.shape[1]
    best, best_acc = None, -1.0
    for l2 in l2_grid:
        res = scipy.optimize.minimize(softmax_regression_loss, np.zeros(D * K + K),
                                      args=(X_train, y_train, K, l2), jac=True,
                                      method="L-BFGS-B", options={"maxiter": max_iter})
        probe = LinearProbe(res.x[:D * K].reshape(D, K), res.x[D * K:], l2, mean, scale)
        acc = float((probe.predict(X_dev) == y_dev).mean()) if len(y_dev) else 0.0
        if acc > best_acc:
            best, best_acc = probe, acc
    return best, best_acc


def bag_of_words(texts: Sequence[str], vocab: dict[str, int] | None = None,
                 min_count: int = 1) -> tuple[scipy.sparse.csr_matrix, dict[str, int]]:
    """Word counts of each text (BERT's BasicTokenizer words, lower-cased; CJK characters
    are words), as a sparse (N, |vocab|) matrix. Without ``vocab`` the vocabulary is the
    words occurring at least ``min_count`` times in ``texts``; unknown words are dropped."""
    tok = BasicTokenizer(do_lower_case=True)
    words = [tok.tokenize(t) for t in texts]
    if vocab is None:
        counts: dict[str, int] = {}
        for ws in words:
            for w in ws:
                counts[w] = counts.get(w, 0) + 1
        vocab = {w: i for i, w in enumerate(sorted(w for w, c in counts.items()
                                                   if c >= min_count))}
    rows, cols = [], []
    for r, ws in enumerate(words):
        for w in ws:
            j = vocab.get(w)
            if j is not None:
                rows.append(r)
                cols.append(j)
    X = scipy.sparse.csr_matrix((np.ones(len(rows)), (rows, cols)),
                                shape=(len(texts), len(vocab)))
    X.sum_duplicates()
    return X, vocab


def mean_pooled_features(model, tokenizer, texts: Sequence, max_seq_length: int,
                         batch_size: int = 64, xp=np) -> np.ndarray:
    """Mean of the final hidden states over the real tokens ([CLS] and [SEP] included, as
    sentence-transformers' mean pooling) of each text, the encoder frozen (eval mode).

    Args:
        model: a :class:`minibert.modeling.BertModel`.
        tokenizer: its :class:`minibert.tokenization.BertTokenizer`.
        texts: strings, or (text_a, text_b) pairs.
    Returns:
        (N, C) float64.
    """
    was_training = model.training
    model.eval()
    out = np.zeros((len(texts), model.config.hidden_size))
    try:
        for s in range(0, len(texts), batch_size):
            chunk = texts[s:s + batch_size]
            encs = [tokenizer(*(t if isinstance(t, tuple) else (t,)), truncation=True,
                              max_length=max_seq_length) for t in chunk]
            T = max(len(e["input_ids"]) for e in encs)
            ids = np.zeros((len(chunk), T), np.int64)
            tt = np.zeros_like(ids)
            mask = np.zeros_like(ids)
            for r, e in enumerate(encs):
                n = len(e["input_ids"])
                ids[r, :n], tt[r, :n], mask[r, :n] = e["input_ids"], e["token_type_ids"], 1
            h = to_numpy(model(xp.asarray(ids), xp.asarray(tt), xp.asarray(mask))
                         .last_hidden_state).astype(np.float64)              # (B, T, C)
            out[s:s + len(chunk)] = mean_pooling_forward(h, mask)[0]
    finally:
        model.train(was_training)
    return out
