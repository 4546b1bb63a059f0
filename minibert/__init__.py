"""minibert: BERT from scratch on NumPy and CuPy, every backward pass written by hand.

The package loads lazily (PEP 562): ``import minibert`` loads nothing else, and
``from minibert import BertModel`` or ``minibert.pipeline`` loads only the module that
defines the name. The core (``backend``, ``nn``, ``modeling``, ``albert``, ``distilbert``,
``electra``, ``heads``, ``optim``, ``gradcheck``, ``testing``) needs NumPy and SciPy alone
(``testing`` also Hypothesis) and runs the formulas it shows; the jobs switch on the fast paths
(:func:`minibert.fast.set_fast_paths`).
"""
from __future__ import annotations

import importlib

# public name -> the submodule that defines it
_EXPORTS = {
    **dict.fromkeys(("ALBERT_PRESETS", "AlbertConfig", "AlbertForPreTraining",
                     "AlbertForQuestionAnswering", "AlbertForSequenceClassification",
                     "AlbertForTokenClassification", "AlbertModel"), "albert"),
    **dict.fromkeys(("DistilBertConfig", "DistilBertForMaskedLM",
                     "DistilBertForQuestionAnswering", "DistilBertForSequenceClassification",
                     "DistilBertForTokenClassification", "DistilBertModel"), "distilbert"),
    **dict.fromkeys(("ElectraConfig", "ElectraForMaskedLM", "ElectraForPreTraining",
                     "ElectraForQuestionAnswering", "ElectraForSequenceClassification",
                     "ElectraForTokenClassification", "ElectraModel"), "electra"),
    **dict.fromkeys(("BertForQuestionAnswering", "BertForSequenceClassification",
                     "BertForTokenClassification", "QuestionAnsweringModelOutput",
                     "SequenceClassifierOutput", "TokenClassifierOutput"), "heads"),
    **dict.fromkeys(("PRESETS", "BertConfig", "BertForPreTraining", "BertForPreTrainingOutput",
                     "BertModel", "BertModelOutput"), "modeling"),
    "pipeline": "pipelines",
    "explain": "attribution",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    """Load the submodule that defines ``name`` on first use (PEP 562); a submodule name
    (``minibert.fast_cpu``) imports that submodule.

    Raises:
        AttributeError: no such name or submodule.
    """
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__():
    return sorted([*globals(), *_EXPORTS])
