"""The model family of a config, as transformers' Auto classes choose it: BERT, ALBERT or
ELECTRA (``"electra"``: :mod:`minibert.electra`, whose classes likewise subclass BERT's).

A config says which family it belongs to by its class and its ``model_type`` (``"bert"``,
``"albert"``, transformers' names), which checkpoints and ``config.json`` record. Every
ALBERT class subclasses the BERT class of the same role (``AlbertModel`` is a
``BertModel``, ``AlbertForSequenceClassification`` a ``BertForSequenceClassification``
...), so code written against the BERT class takes either; only construction has to pick,
and it picks here:

    config_from_dict({"model_type": "albert", ...})     -> AlbertConfig
    model_class(albert_config, BertForTokenClassification) -> AlbertForTokenClassification
"""
from __future__ import annotations

from typing import Any

from .albert import (AlbertConfig, AlbertForPreTraining, AlbertForQuestionAnswering,
                     AlbertForSequenceClassification, AlbertForTokenClassification, AlbertModel)
from .distilbert import (DistilBertConfig, DistilBertForMaskedLM,
                         DistilBertForQuestionAnswering, DistilBertForSequenceClassification,
                         DistilBertForTokenClassification, DistilBertModel)
from .heads import (BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification)
from .electra import (ElectraConfig, ElectraForMaskedLM, ElectraForQuestionAnswering,
                      ElectraForSequenceClassification, ElectraForTokenClassification,
                      ElectraModel)
from .modeling import BertConfig, BertForPreTraining, BertModel, ModelConfig

__all__ = ["ALBERT_CLASSES", "CONFIG_CLASSES", "DISTILBERT_CLASSES", "ELECTRA_CLASSES",
           "FAMILY_CLASSES", "MLM_HEAD_PREFIXES", "bert_role",
           "config_class", "config_from_dict", "has_mlm_head", "model_class"]

# model_type -> config class
CONFIG_CLASSES: dict[str, type[ModelConfig]] = {"bert": BertConfig, "albert": AlbertConfig,
                                                "distilbert": DistilBertConfig,
                                                "electra": ElectraConfig}

# BERT class of a role -> the ALBERT class of that role
ALBERT_CLASSES: dict[type, type] = {
    BertModel: AlbertModel,
    BertForPreTraining: AlbertForPreTraining,
    BertForSequenceClassification: AlbertForSequenceClassification,
    BertForTokenClassification: AlbertForTokenClassification,
    BertForQuestionAnswering: AlbertForQuestionAnswering,
}

# BERT class of a role -> the DistilBERT class of that role (Sanh et al. 2019; no
# sentence-level head: BertForPreTraining's role is the masked LM)
DISTILBERT_CLASSES: dict[type, type] = {
    BertModel: DistilBertModel,
    BertForPreTraining: DistilBertForMaskedLM,
    BertForSequenceClassification: DistilBertForSequenceClassification,
    BertForTokenClassification: DistilBertForTokenClassification,
    BertForQuestionAnswering: DistilBertForQuestionAnswering,
}

# BERT class of a role -> the ELECTRA class of that role. The masked-LM role is the
# generator's (ElectraForMaskedLM); the discriminator (ElectraForPreTraining, the model
# published for fine-tuning) plays no BERT role: its encoder serves the heads.
ELECTRA_CLASSES: dict[type, type] = {
    BertModel: ElectraModel,
    BertForPreTraining: ElectraForMaskedLM,
    BertForSequenceClassification: ElectraForSequenceClassification,
    BertForTokenClassification: ElectraForTokenClassification,
    BertForQuestionAnswering: ElectraForQuestionAnswering,
}

# config class -> its family's {BERT class of a role: the family's class} (BERT's roles are
# its own classes)
FAMILY_CLASSES: dict[type[ModelConfig], dict[type, type]] = {
    AlbertConfig: ALBERT_CLASSES, DistilBertConfig: DISTILBERT_CLASSES,
    ElectraConfig: ELECTRA_CLASSES}


def config_class(model_type: str) -> type[ModelConfig]:
    """The config class of ``model_type`` (a key of :data:`CONFIG_CLASSES`).

    Raises:
        ValueError: an unknown model_type, or one that is not a string (the message lists
            the known ones).
    """
    if isinstance(model_type, str) and model_type in CONFIG_CLASSES:
        return CONFIG_CLASSES[model_type]
    raise ValueError(f"model_type {model_type!r}: expected one of "
                     f"{', '.join(CONFIG_CLASSES)}")


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """The config a dict describes (a checkpoint's or ``config.json``'s): the class of its
    ``model_type`` (``"bert"`` when absent: what files written before the field hold),
    built from its fields (other keys ignored).

    Raises:
        ValueError: an unknown model_type, or fields the config refuses (naming the field).
    """
    return config_class(d.get("model_type", "bert")).from_dict(d)


def model_class(config: ModelConfig, bert_class: type) -> type:
    """The class that plays ``bert_class``'s role (a key of :data:`ALBERT_CLASSES`) for the
    family of ``config``: ``bert_class`` itself for a BERT config, its variant in the
    config's family otherwise (:data:`FAMILY_CLASSES`: ALBERT, DistilBERT, ELECTRA).

    Raises:
        ValueError: a config of another family and a class with no variant in that family.
    """
    table = FAMILY_CLASSES.get(type(config))
    if table is None:
        return bert_class
    if bert_class not in table:
        family = {"albert": "ALBERT", "distilbert": "DistilBERT",
                  "electra": "ELECTRA"}.get(config.model_type, config.model_type)
        raise ValueError(f"{bert_class.__name__} has no {family} variant")
    return table[bert_class]


# where each family keeps its masked-LM head in a state dict: BERT's cls.predictions.*,
# ALBERT's predictions.* (transformers' names; the decoder weight may be absent, tied)
MLM_HEAD_PREFIXES: dict[type[ModelConfig], str] = {BertConfig: "cls.predictions.",
                                                   AlbertConfig: "predictions.",
                                                   DistilBertConfig: "vocab_",
                                                   ElectraConfig: "generator_predictions."}


def has_mlm_head(state) -> bool:
    """Whether the weights ``state`` ({name: array}, minibert / Hugging Face names, BERT
    or ALBERT) hold a masked-LM head: any tensor under a :data:`MLM_HEAD_PREFIXES` prefix.
    A head that is there only in part counts, so that loading it into a model with the head
    reports the tensors missing rather than dropping the head unseen."""
    prefixes = tuple(MLM_HEAD_PREFIXES.values())
    return any(name.startswith(prefixes) for name in state)


def bert_role(architecture: str | None) -> str | None:
    """The name of the BERT class whose role a class name plays (an ``architectures``
    entry of ``config.json``, a checkpoint's record): ``"AlbertForTokenClassification"``
    -> ``"BertForTokenClassification"``; any other name, and None, as it is."""
    names = {ours.__name__: bert.__name__ for table in FAMILY_CLASSES.values()
             for bert, ours in table.items()}
    return names.get(architecture, architecture)
