"""``electra``: replaced-token detection (Clark et al. 2020, "ELECTRA: Pre-training Text
Encoders as Discriminators Rather Than Generators") on the inputs of ``mlm``, from scratch.

The data are those of :class:`~minibert.objectives.mlm.FullSentencesMLM` (packed full
sentences, 15% of the tokens masked as BERT does), no sentence task. A small masked-LM
*generator* fills the masked positions with tokens sampled from its output distribution;
the *discriminator* (the model kept for fine-tuning) reads the corrupted sequence and
predicts, for every real token, whether it was replaced. The discriminator learns from all
tokens, not only the 15% that are masked, which is where ELECTRA's sample efficiency comes
from (section 3.2). Loss (section 2):

    L = L_MLM(generator) + lambda * L_disc,    lambda = 50

with L_disc the mean binary cross-entropy over the real tokens of the corrupted input,
labels 1 = replaced, 0 = original (a sampled token equal to the original counts as
original, as in the paper; [PAD] is never sampled, since its embedding row gets no
gradient). The sampling is not differentiated: the generator learns from its MLM loss only
(no adversarial gradient, section 2).

Embedding sharing (section 3.1): generator and discriminator share the token, position and
token-type embeddings (and their LayerNorm). Here both have the same hidden size, so the
tables are shared directly; the generator is made smaller by depth
(``generator_layers``) rather than ELECTRA's width (1/4 to 1/2 of the discriminator's,
with an embedding projection), which keeps the model free of a projection layer.

Parameter names: the discriminator is ``bert.*`` (so a pretraining run loads into
``finetune.py`` like any BERT run) with HF ``ElectraForPreTraining``'s head names
``discriminator_predictions.dense`` / ``dense_prediction``; the generator is
``generator.*`` (a ``BertForPreTraining`` without sentence head), its embeddings the
discriminator's Parameters.

Export: :meth:`ElectraForPreTraining.to_electra` gives the discriminator as a
:class:`minibert.electra.ElectraForPreTraining` (``model_type`` "electra", E = H so no
``embeddings_project``; ``bert.*`` renamed ``electra.*``), which
:func:`minibert.hf.save_hf_directory` writes as a directory transformers loads as
``ElectraForPreTraining``. :meth:`ElectraForPreTraining.generator_to_electra` gives the
generator as an ``ElectraForMaskedLM`` of ``embedding_size`` = ``hidden_size`` = H (a
depth-reduced generator is one transformers' class expresses exactly when ``hidden_act``
is "gelu", the activation its generator head hard-codes); ``--export-hf DIR`` writes it
as ``DIR/generator``.

Metrics: the generator's MLM ones (:meth:`Objective.stats`), to which
:class:`ReplacedTokenDetection` adds the discriminator's ``rtd_loss`` (nats per real
token), ``rtd_acc`` (its accuracy over real tokens) and ``rtd_replaced`` (the share of
real tokens the generator's samples changed).

Shape legend: B batch, T sequence, P masked slots per sequence, C hidden, V vocab.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..backend import compute_dtype, get_array_module
from ..electra import ElectraDiscriminatorPredictions
from ..modeling import BertConfig, BertForPreTraining, BertModel, BertPreTrainedModel
from .mlm import FullSentencesMLM

__all__ = ["DISC_WEIGHT", "ElectraDiscriminatorPredictions", "ElectraForPreTraining",
           "ElectraForPreTrainingOutput", "ReplacedTokenDetection"]

DISC_WEIGHT = 50.0   # lambda of section 2 / Table 7's "disc weight"

# the config fields a BERT-shaped discriminator and transformers' ElectraConfig share
# (ElectraForPreTraining.to_electra and from_electra add the ones each side needs)
_SHARED_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "hidden_act", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
    "initializer_range", "layer_norm_eps", "pad_token_id", "classifier_dropout",
    "num_labels")


@dataclass
class ElectraForPreTrainingOutput:
    """loss: 0-d, mlm_loss + disc_weight * rtd_loss. mlm_loss: the generator's MLM loss
    (nats per masked slot). rtd_loss: mean binary cross-entropy per real token (nats).
    prediction_logits: (B, P, V) the generator's. rtd_logits: (B, T) the discriminator's
    (> 0: "replaced"). rtd_labels: (B, T) int, 1 where the corrupted input differs from
    the original. replaced_ids: (B, T) the corrupted input."""

    loss: Any
    mlm_loss: Any
    rtd_loss: Any
    prediction_logits: Any
    rtd_logits: Any
    rtd_labels: Any
    replaced_ids: Any


class ElectraForPreTraining(BertPreTrainedModel):
    """Generator + discriminator with shared embeddings, trained by replaced-token
    detection (see the module docstring).

    Args:
        config: the discriminator's hyper-parameters.
        generator_layers: encoder layers of the generator (>= 1; default: half the
            discriminator's, at least 1).
        disc_weight: lambda, the weight of the discriminator's loss (50 in the paper).
        seed, dtype: as :class:`~minibert.modeling.BertForPreTraining`.
    Raises:
        ValueError: generator_layers < 1 or a non-positive disc_weight.
    """

    def __init__(self, config: BertConfig, *, generator_layers: int | None = None,
                 disc_weight: float = DISC_WEIGHT, seed: int = 0, dtype=np.float32):
        L = config.num_hidden_layers
        generator_layers = max(1, L // 2) if generator_layers is None else int(generator_layers)
        if generator_layers < 1:
            raise ValueError(f"generator_layers must be >= 1, got {generator_layers}")
        if not disc_weight > 0:
            raise ValueError(f"disc_weight must be > 0, got {disc_weight}")
        self.config = config
        rng = np.random.default_rng(seed)
        self.bert = BertModel(config, add_pooling_layer=False, rng=rng, dtype=dtype)
        self.discriminator_predictions = ElectraDiscriminatorPredictions(config, rng, dtype)
        gen_config = replace(config, num_hidden_layers=generator_layers)
        self.generator = BertForPreTraining(gen_config, seed=int(rng.integers(2 ** 31)),
                                            dtype=dtype, seq_relationship_head=False)
        self.generator_layers, self.disc_weight = generator_layers, float(disc_weight)
        # share the embedding Parameters (the modules stay apart: each keeps its own cache)
        mine, theirs = self.bert.embeddings, self.generator.bert.embeddings
        for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
            if hasattr(mine, name):
                getattr(theirs, name).weight = getattr(mine, name).weight
        theirs.LayerNorm.weight, theirs.LayerNorm.bias = mine.LayerNorm.weight, mine.LayerNorm.bias
        # the generator's MLM decoder is tied to its word embeddings: now the shared table
        self.generator.cls.predictions.decoder.weight = mine.word_embeddings.weight
        self._rng = None
        self._cache = None

    def to_electra(self):
        """The discriminator as a :class:`minibert.electra.ElectraForPreTraining` with a
        copy of its weights (``bert.*`` -> ``electra.*``, ``discriminator_predictions.*``
        as is), on the host, in this model's dtype: what a Hugging Face export of the run
        writes (transformers' ``ElectraForPreTraining`` with ``embedding_size`` =
        ``hidden_size``).

        Raises:
            ValueError: a config transformers' ELECTRA cannot express (pre-LN, sinusoidal
                positions, mean pooling), naming the field.
        """
        from ..electra import ElectraForPreTraining as Discriminator
        model = Discriminator(_electra_config(self.config), dtype=self.dtype)
        state = {("electra." + k[len("bert."):] if k.startswith("bert.") else k): v
                 for k, v in self.state_dict().items()
                 if k.startswith(("bert.", "discriminator_predictions."))}
        model.load_state_dict(state)
        return model

    def generator_to_electra(self):
        """The generator as a :class:`minibert.electra.ElectraForMaskedLM` with a copy of
        its weights, on the host, in this model's dtype: transformers'
        ``ElectraForMaskedLM`` with ``embedding_size`` = ``hidden_size`` = H and
        ``generator_layers`` layers. The map is exact: ``generator.bert.*`` ->
        ``electra.*`` (the embeddings are the shared tables), BERT's MLM transform
        ``cls.predictions.transform.{dense,LayerNorm}`` (H -> H, activation, LayerNorm) ->
        ``generator_predictions.{dense,LayerNorm}`` (H -> E = H, GELU, LayerNorm), the
        decoder bias -> ``generator_lm_head.bias`` (its weight is the word embeddings
        on both sides).

        Raises:
            ValueError: ``hidden_act`` other than "gelu" (transformers' generator head
                applies the exact GELU whatever ``hidden_act`` says, ours ``hidden_act``),
                or what :meth:`to_electra` refuses, naming the field.
        """
        from ..electra import ElectraForMaskedLM
        c = self.generator.config
        if c.hidden_act != "gelu":
            raise ValueError(f"hidden_act {c.hidden_act!r}: transformers' ELECTRA generator "
                             "head applies the exact GELU, this generator's MLM head "
                             f"{c.hidden_act!r}")
        model = ElectraForMaskedLM(_electra_config(c), dtype=self.dtype)
        renames = (("generator.bert.", "electra."),
                   ("generator.cls.predictions.transform.", "generator_predictions."),
                   ("generator.cls.predictions.bias", "generator_lm_head.bias"))
        state = {new + k[len(old):]: v for k, v in self.state_dict().items()
                 for old, new in renames if k.startswith(old)}
        state["generator_lm_head.weight"] = state["electra.embeddings.word_embeddings.weight"]
        model.load_state_dict(state)
        return model

    def set_dropout_rng(self, rng) -> None:
        """The run's generator serves the dropout layers and the generator's sampling."""
        super().set_dropout_rng(rng)
        self._rng = rng

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                masked_lm_positions=None, masked_lm_ids=None, masked_lm_weights=None,
                next_sentence_label=None) -> ElectraForPreTrainingOutput:
        """One ELECTRA step's forward on a masked batch (the MLM data of google-research/
        bert's fixed-shape form, as :class:`~minibert.modeling.BertForPreTraining`).

        Args:
            input_ids: (B, T) the masked input; masked_lm_positions / _ids / _weights:
                (B, P) where the generator predicts and what the original tokens were.
            next_sentence_label: must be None (ELECTRA has no sentence task).
        Returns:
            :class:`ElectraForPreTrainingOutput`.
        Raises:
            ValueError: missing masked_lm arrays or a next_sentence_label; see
                BertForPreTraining.forward for shapes.
        """
        if masked_lm_positions is None or masked_lm_ids is None:
            raise ValueError("ElectraForPreTraining needs masked_lm_positions and masked_lm_ids")
        if next_sentence_label is not None:
            raise ValueError("ELECTRA has no sentence-level task (next_sentence_label given)")
        xp = get_array_module(input_ids)
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = xp.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = xp.zeros_like(input_ids)
        if masked_lm_weights is None:
            masked_lm_weights = xp.ones(masked_lm_ids.shape, dtype=np.float32)
        gen = self.generator(input_ids, token_type_ids, attention_mask, masked_lm_positions,
                             masked_lm_ids, masked_lm_weights)
        logits = gen.prediction_logits                                   # (B, P, V)
        # sample from the generator, Gumbel-max: argmax(logits - log(-log u)); no gradient
        u = self._draw(logits.shape, compute_dtype(logits.dtype), xp)
        noisy = logits.astype(u.dtype) - xp.log(-xp.log(u))                  # (B, P, V)
        noisy[..., self.config.pad_token_id] = -xp.inf    # never [PAD]: its row is not trained
        sampled = noisy.argmax(axis=-1)                                  # (B, P)
        real = masked_lm_weights > 0                                     # (B, P)
        rows = xp.broadcast_to(xp.arange(B)[:, None], masked_lm_positions.shape)
        original = input_ids.copy()
        original[rows[real], masked_lm_positions[real]] = masked_lm_ids[real]
        corrupted = input_ids.copy()
        corrupted[rows[real], masked_lm_positions[real]] = sampled[real]
        labels = (corrupted != original).astype(np.int64)                # (B, T)
        h = self.bert(corrupted, token_type_ids, attention_mask).last_hidden_state
        z = self.discriminator_predictions(h)                            # (B, T)
        zc = z.astype(compute_dtype(z.dtype))
        mask = attention_mask.astype(zc.dtype)
        n = xp.maximum(mask.sum(), 1.0)
        # binary cross-entropy with logits, stable: max(z, 0) - z y + log(1 + exp(-|z|))
        bce = xp.maximum(zc, 0) - zc * labels + xp.log1p(xp.exp(-xp.abs(zc)))
        rtd_loss = (bce * mask).sum() / n
        loss = gen.mlm_loss + self.disc_weight * rtd_loss
        self._cache = (zc, labels, mask, n, z.dtype)
        return ElectraForPreTrainingOutput(loss, gen.mlm_loss, rtd_loss, logits, z, labels,
                                           corrupted)

    def _draw(self, shape, dtype, xp):
        rng = self._rng if self._rng is not None else np.random.default_rng(0)
        u = xp.asarray(rng.random(shape, dtype=np.float32 if dtype == np.float32 else
                                  np.float64), dtype=dtype)
        return xp.clip(u, np.finfo(dtype).tiny, 1.0 - np.finfo(dtype).eps)

    def backward(self, dloss=1.0) -> None:
        """Add dloss * d(loss)/d(param) into every parameter's ``grad`` (the shared
        embeddings receive both networks' gradients).

        Raises:
            RuntimeError: no forward came before.
        """
        zc, labels, mask, n, dtype = self.take_cache()
        # forward: rtd_loss = sum(bce(z, y) * mask) / n;  d bce / dz = sigmoid(z) - y
        xp = get_array_module(zc)
        sig = 1.0 / (1.0 + xp.exp(-zc))
        dz = ((sig - labels) * mask) * (dloss * self.disc_weight / n)    # (B, T)
        self.bert.backward(self.discriminator_predictions.backward(dz.astype(dtype)), None)
        # forward: loss = mlm_loss + disc_weight * rtd_loss  ->  the generator's part
        self.generator.backward(dloss)


def _electra_config(c: BertConfig):
    """The :class:`minibert.electra.ElectraConfig` (E = H) of the BERT-shaped ``c``.

    Raises:
        ValueError: sinusoidal positions, or what ElectraConfig refuses (pre-LN, mean
            pooling), naming the field.
    """
    from ..electra import ElectraConfig
    if c.position_embedding_type != "absolute":
        raise ValueError(f"position_embedding_type {c.position_embedding_type!r}: "
                         "transformers' ELECTRA has learned absolute positions only")
    fields = {k: getattr(c, k) for k in (*_SHARED_FIELDS, "norm_position", "classifier_pooling")}
    return ElectraConfig(embedding_size=c.hidden_size, **fields)


def from_electra(config, state: dict) -> tuple[BertConfig, dict]:
    """The inverse of :meth:`ElectraForPreTraining.to_electra`: an ELECTRA discriminator's
    config (:class:`minibert.electra.ElectraConfig`) and weights (``electra.*``,
    ``discriminator_predictions.*``) as the BERT-shaped config and ``bert.*`` names of
    this objective's model, so that a Hugging Face ELECTRA directory (one this objective
    exported, or any with ``embedding_size`` = ``hidden_size``) starts a run
    (``--init-checkpoint``). Tensors of other heads (a generator's) are left out; the
    generator starts fresh.

    Raises:
        ValueError: embedding_size != hidden_size (the objective's model has no
            ``embeddings_project``), naming both.
    """
    if config.embedding_size != config.hidden_size:
        raise ValueError(f"embedding_size {config.embedding_size} != hidden_size "
                         f"{config.hidden_size}: --objective electra continues ELECTRA models "
                         "without embeddings_project only (E = H)")
    fields = {k: getattr(config, k) for k in (*_SHARED_FIELDS, "position_embedding_type")}
    out = {}
    for k, v in state.items():
        if k.startswith("electra."):
            out["bert." + k[len("electra."):]] = v
        elif k.startswith("discriminator_predictions."):
            out[k] = v
    return BertConfig(**fields), out


class ReplacedTokenDetection(FullSentencesMLM):
    """ELECTRA on full-sentence inputs (see the module docstring): the model is an
    :class:`ElectraForPreTraining`, the metrics the MLM ones plus the ``rtd_*`` terms."""

    name = "electra"
    sentence_task = None
    metric_tasks = ("mlm", "rtd")        # the MLM means, then the discriminator's

    def build_model(self, config, *, seed: int = 0, dtype=None, label_smoothing: float = 0.0,
                    generator_layers: int | None = None, **kwargs):
        """:class:`ElectraForPreTraining` (generator of ``generator_layers`` layers, default
        half the discriminator's; ``kwargs``, e.g. ``disc_weight``, go to it).

        Raises:
            ValueError: label smoothing, which ELECTRA's losses do not take.
        """
        if label_smoothing:
            raise ValueError("--label-smoothing is not supported with --objective electra")
        return ElectraForPreTraining(config, generator_layers=generator_layers, seed=seed,
                                     dtype=dtype or np.float32, **kwargs)

    def stats(self, outputs: ElectraForPreTrainingOutput, inputs: dict) -> dict:
        """Device sums: the generator's MLM sums of :meth:`Objective.stats` (from
        ``outputs.mlm_loss`` and ``outputs.prediction_logits``), plus the discriminator's
        ``rtd_loss_sum`` (nats), ``rtd_correct``, ``rtd_count`` (real tokens, attention mask
        > 0) and ``rtd_replaced`` (real tokens the generator changed); 0-d arrays.

        Inputs: as :meth:`Objective.stats`, with ``attention_mask`` (B, T).
        """
        xp = get_array_module(outputs.rtd_logits)
        real = inputs["attention_mask"] > 0                                     # (B, T)
        tokens = real.sum()
        said = (outputs.rtd_logits > 0).astype(np.int64)                        # (B, T)
        rtd = {"rtd_loss_sum": outputs.rtd_loss * tokens,
               "rtd_correct": ((said == outputs.rtd_labels) & real).sum(),
               "rtd_count": tokens,
               "rtd_replaced": (outputs.rtd_labels * real).sum()}
        return super().stats(outputs, inputs) | {k: xp.asarray(v) for k, v in rtd.items()}

    def summarize(self, totals: dict) -> dict:
        """Host means: those of :meth:`Objective.summarize` for ``mlm`` and ``rtd``
        (``rtd_loss`` in nats per real token, ``rtd_acc``), plus ``rtd_replaced``, the
        share of real tokens replaced; nan where the count is 0."""
        n = totals["rtd_count"]
        return super().summarize(totals) | {
            "rtd_replaced": totals["rtd_replaced"] / n if n else math.nan}
