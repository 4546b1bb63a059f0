"""Fine-tuning: labelled data (:mod:`.data`), metrics (:mod:`.metrics`) and the classifier
(:mod:`.classifier`)."""
from .classifier import build_classifier, evaluate, predict_split
from .data import (Batch, DatasetError, EncodedSplit, Example, encode_split, iterate_batches,
                   label_ids, label_list, length_grouped_batches, pad_batch, read_tsv)
from .metrics import classification_metrics, confusion_matrix, softmax_np

__all__ = ["Batch", "DatasetError", "EncodedSplit", "Example", "build_classifier",
           "classification_metrics", "confusion_matrix", "encode_split", "evaluate",
           "iterate_batches", "label_ids", "label_list", "length_grouped_batches", "pad_batch",
           "predict_split",
           "read_tsv", "softmax_np"]
