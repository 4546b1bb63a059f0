"""Fine-tuning: labelled data (:mod:`.data`), metrics (:mod:`.metrics`), the models of a
fine-tuning run built from a start (:mod:`.models`), token classification
(:mod:`.tagging`), extractive question answering (:mod:`.qa`), and the three tasks of
``finetune.py`` behind one interface (:mod:`.tasks`).

The job (``finetune.py``) runs from Python too: :class:`FinetuningConfig` holds its
options and :func:`run_finetuning` (in :mod:`.job`, imported on first use) runs it::

    from minibert.finetuning import FinetuningConfig, run_finetuning
    run_finetuning(FinetuningConfig(init="runs/pretrain", output_dir="runs/ft"))
"""
from .models import eval_batches, evaluate, model_from_start, predict_split
from .data import (FinetuningBatch, DatasetError, EncodedSplit, Example, LabelSet, choose_labels,
                   encode_split, iterate_batches, label_ids, label_list, label_occurrences,
                   length_grouped_batches, pad_batch, read_label_file, read_tsv, sort_labels)
from .config import FinetuningConfig
from .metrics import classification_metrics, confusion_matrix, log_softmax_np, softmax_np
from .qa import (QAExample, QAFeatures, QAPrediction, exact_match_score, f1_score,
                 normalize_answer, postprocess_qa_predictions, prepare_qa_features,
                 read_squad, squad_metrics)
from .tagging import (IGNORE_INDEX, MostFrequentTagBaseline, TaggedSentence, TaggedSplit,
                      check_tags, decode_tags, encode_tagging, entity_metrics, get_entities,
                      is_entity_tagset, read_conll, sort_tags, tag_list, tag_occurrences,
                      tagging_metrics, token_accuracy, warn_long_sentences)



def __getattr__(name: str):
    """``run_finetuning`` (the job module, loaded on first use: it imports the loop and
    task distillation)."""
    if name == "run_finetuning":
        from .job import run_finetuning
        return run_finetuning
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FinetuningConfig", "run_finetuning", "FinetuningBatch", "DatasetError",
           "EncodedSplit", "Example", "model_from_start", "eval_batches",
           "classification_metrics", "confusion_matrix", "encode_split", "evaluate",
           "iterate_batches", "label_ids", "label_list", "length_grouped_batches", "pad_batch",
           "predict_split", "LabelSet", "choose_labels", "label_occurrences",
           "read_label_file", "sort_labels",
           "read_tsv", "log_softmax_np", "softmax_np",
           # token classification
           "IGNORE_INDEX", "MostFrequentTagBaseline", "TaggedSentence", "TaggedSplit",
           "check_tags", "decode_tags", "encode_tagging", "entity_metrics", "get_entities",
           "is_entity_tagset", "read_conll", "sort_tags", "tag_list", "tag_occurrences",
           "tagging_metrics", "token_accuracy",
           "warn_long_sentences",
           # question answering
           "QAExample", "QAFeatures", "QAPrediction", "exact_match_score", "f1_score",
           "normalize_answer", "postprocess_qa_predictions", "prepare_qa_features",
           "read_squad", "squad_metrics"]
