"""A student's starting weights taken from its teacher, without any data.

* :func:`every_other_layer_state` (with :func:`every_other_layer_config`): DistilBERT's
  initialisation, the teacher's layers 0, 2, 4, ... and every other tensor as is (Sanh et
  al. 2019, section 3).
* :func:`projected_embeddings_state`: a narrower student's embedding tables, the teacher's
  projected onto their principal directions.

The third start, the teacher pruned to the student's sizes on calibration batches, is
:mod:`.pruning`; :func:`minibert.distillation.init_student` chooses between them.

Shape legend: V = vocab size, Ct / Cs = teacher / student hidden size.
"""
from __future__ import annotations

import math
import re

import numpy as np

from ..modeling import BertConfig

__all__ = ["LAYER_KEY", "every_other_layer_config", "every_other_layer_state",
           "projected_embeddings_state"]

# an encoder layer's tensor: group 1 the layer number, group 2 the name inside the layer
LAYER_KEY = re.compile(r"bert\.encoder\.layer\.(\d+)\.(.+)")


def every_other_layer_config(teacher: BertConfig, **overrides) -> BertConfig:
    """The teacher's config with ceil(L / 2) layers (layers 0, 2, 4, ... of the teacher);
    ``overrides`` (e.g. dropout) replace fields."""
    d = teacher.to_dict()
    d.update(num_hidden_layers=math.ceil(teacher.num_hidden_layers / 2), **overrides)
    return BertConfig.from_dict(d)


def every_other_layer_state(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A student's initial weights from the teacher's ``state`` (names ``bert.*`` ...):
    encoder layers 0, 2, 4, ... renumbered 0, 1, 2, ..., the odd layers dropped, every
    other tensor (embeddings, pre-LN final norm, pooler, heads) kept as is.

    DistilBERT (Sanh et al. 2019, section 3: "we initialize the student from the teacher
    by taking one layer out of two"; seed 003 section 3.11, parameter elimination). Load
    the result with :func:`minibert.hf.load_pretrained_weights` into a model built with
    :func:`every_other_layer_config`.
    """
    out = {}
    for k, v in state.items():
        m = LAYER_KEY.fullmatch(k)
        if m is None:
            out[k] = v
        elif int(m.group(1)) % 2 == 0:
            out[f"bert.encoder.layer.{int(m.group(1)) // 2}.{m.group(2)}"] = v
    return out


_EMBEDDINGS = ("word_embeddings", "position_embeddings", "token_type_embeddings")


def projected_embeddings_state(state: dict[str, np.ndarray], hidden_size: int
                               ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A narrower student's embedding tables from the teacher's: each table projected onto
    the top ``hidden_size`` principal directions of the teacher's word embeddings.

    With E (V, Ct) the teacher's word embeddings, m their mean row and U (Ct, Cs) the
    right singular vectors of E - m with the Cs largest singular values (principal
    component analysis; computed as the top eigenvectors of (E - m)^T (E - m)), the
    student gets (E - m) @ U as word embeddings and P @ U, S @ U as position and
    token-type embeddings. Projection is linear, so the sum the embedding
    LayerNorm sees is the projected sum of the teacher's, less m @ U. Words the pretraining
    corpus never shows still start where the teacher puts them, which a random table
    cannot give. ``basis`` = U is also the natural start of the cosine loss's W_h
    (``hidden_projection.weight``, (Ct, Cs)): it maps student states back into the span
    they came from. Our choice of initialisation (an SVD truncation, as ALBERT's
    factorised embeddings (Lan et al. 2020) reduce the embedding width); no paper's recipe.

    Args:
        state: the teacher's weights, HF names (``bert.embeddings.*``), any float dtype.
        hidden_size: the student's width Cs, 1 <= Cs <= Ct.
    Returns:
        ({``bert.embeddings.<table>.weight``: float32 array}, basis U (Ct, Cs) float32 with
        orthonormal columns).
    Raises:
        KeyError: the state lacks the word-embedding table.
        ValueError: ``hidden_size`` outside [1, Ct].
    """
    words = np.asarray(state["bert.embeddings.word_embeddings.weight"], np.float64)
    width = words.shape[1]
    if not 1 <= hidden_size <= width:
        raise ValueError(f"a student of width {hidden_size} cannot take projected embeddings "
                         f"of a teacher of width {width} (need 1 <= width <= {width})")
    centred = words - words.mean(0)
    # the right singular vectors of the centred table are the eigenvectors of its (Ct, Ct)
    # scatter matrix; eigh gives all Ct of them (orthonormal) even when V < Ct, where a
    # thin SVD would give only V
    eigenvalues, vectors = np.linalg.eigh(centred.T @ centred)
    basis = vectors[:, np.argsort(eigenvalues)[::-1][:hidden_size]]
    out = {}
    for name in _EMBEDDINGS:
        key = f"bert.embeddings.{name}.weight"
        if key in state:
            table = centred if name == "word_embeddings" else np.asarray(state[key], np.float64)
            out[key] = (table @ basis).astype(np.float32)
    return out, basis.astype(np.float32)
