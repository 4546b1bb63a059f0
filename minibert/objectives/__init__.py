"""Pretraining objectives, one module each, and the registry that names them.

================  ==========================================  =============  =============
name              inputs                                      sentence task  min documents
================  ==========================================  =============  =============
``mlm+nsp``       BERT sentence pairs (:mod:`.nsp`)            ``"nsp"``      2
``mlm+sop``       ALBERT consecutive segments (:mod:`.sop`)    ``"sop"``      1
``mlm``           RoBERTa FULL-SENTENCES (:mod:`.mlm`)         None           1
``electra``       ``mlm``'s inputs, ELECTRA's replaced-token   None           1
                  detection (:mod:`.electra`)
================  ==========================================  =============  =============

A new objective is a subclass of :class:`Objective` in its own module plus an entry in
:data:`OBJECTIVES`.
"""
from __future__ import annotations

from .base import Objective, Segment, segment_rng
from .electra import ReplacedTokenDetection
from .mlm import FullSentencesMLM
from .nsp import NextSentencePrediction, create_instances_from_document
from .pairs import SentencePairObjective, pack_pair, truncate_seq_pair
from .sop import SentenceOrderPrediction

__all__ = [
    "OBJECTIVES", "FullSentencesMLM", "NextSentencePrediction", "Objective",
    "ReplacedTokenDetection", "Segment",
    "SentenceOrderPrediction", "SentencePairObjective", "create_instances_from_document",
    "get_objective", "pack_pair", "segment_rng", "truncate_seq_pair",
]

OBJECTIVES: dict[str, Objective] = {
    o.name: o for o in (NextSentencePrediction(), SentenceOrderPrediction(), FullSentencesMLM(),
                        ReplacedTokenDetection())
}


def get_objective(name: str | Objective) -> Objective:
    """The registered objective called ``name`` (an :class:`Objective` is returned as is).

    Raises:
        ValueError: no objective has that name (the message lists the names).
    """
    if isinstance(name, Objective):
        return name
    try:
        return OBJECTIVES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown objective {name!r}; choose one of "
                         f"{', '.join(sorted(OBJECTIVES))}") from None
