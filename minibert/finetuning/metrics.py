"""Classification metrics (standard definitions, written here)."""
from __future__ import annotations

import numpy as np

from ..nn.activations import log_softmax

def confusion_matrix(gold: np.ndarray, pred: np.ndarray, num_labels: int) -> np.ndarray:
    """(K, K) int64 counts, rows = gold class, columns = predicted class."""
    m = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(m, (np.asarray(gold), np.asarray(pred)), 1)
    return m


def classification_metrics(gold, pred, num_labels: int) -> dict[str, float]:
    """Accuracy, macro-F1 and Matthews correlation of integer predictions.

    * accuracy = (1/N) sum_i [pred_i = gold_i]
    * macro-F1 = (1/K) sum_k 2 TP_k / (2 TP_k + FP_k + FN_k), a class with no gold and no
      predicted example scoring 0 (scikit-learn's ``f1_score(average="macro",
      zero_division=0)`` over all K labels).
    * MCC, multi-class (Gorodkin 2004, "Comparing two K-category assignments by a
      K-category correlation coefficient"; = Matthews 1975 for K = 2): with confusion
      matrix C, c = trace(C), s = N, t_k = row sums (gold), p_k = column sums (predicted),
      MCC = (c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2)(s^2 - sum_k t_k^2)),
      0 when the denominator is 0 (as scikit-learn).

    Args:
        gold, pred: (N,) int class ids in [0, K). num_labels: K.
    Returns:
        {"accuracy", "macro_f1", "mcc"} as Python floats, and "n" (int).
    Raises:
        ValueError: shapes differ or N = 0.
    """
    gold, pred = np.asarray(gold), np.asarray(pred)
    if gold.shape != pred.shape or gold.ndim != 1 or gold.size == 0:
        raise ValueError(f"metrics need two non-empty (N,) arrays, got {gold.shape} and "
                         f"{pred.shape}")
    C = confusion_matrix(gold, pred, num_labels).astype(np.float64)
    tp = np.diag(C)
    fp = C.sum(axis=0) - tp
    fn = C.sum(axis=1) - tp
    denom = 2 * tp + fp + fn
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    s, c = C.sum(), tp.sum()
    t, p = C.sum(axis=1), C.sum(axis=0)
    den = np.sqrt((s * s - (p * p).sum()) * (s * s - (t * t).sum()))
    mcc = float((c * s - (p * t).sum()) / den) if den > 0 else 0.0
    return {"accuracy": float(c / s), "macro_f1": float(f1.mean()), "mcc": mcc,
            "n": int(gold.size)}


def log_softmax_np(logits: np.ndarray) -> np.ndarray:
    """Log-softmax over the last axis of host logits (..., K) in float64
    (:func:`minibert.nn.activations.log_softmax`); returns float64 of the same shape."""
    return log_softmax(np.asarray(logits, dtype=np.float64), axis=-1)


def softmax_np(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of (N, K) logits, max-subtracted; returns float64 (N, K)."""
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


__all__ = ["confusion_matrix", "classification_metrics", "log_softmax_np", "softmax_np"]
