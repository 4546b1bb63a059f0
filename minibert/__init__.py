"""minibert: BERT from scratch on NumPy and CuPy, every backward pass written by hand."""
from .modeling import (PRESETS, BertConfig, BertForPreTraining, BertForPreTrainingOutput,
                       BertForSequenceClassification, BertModel, BertModelOutput,
                       SequenceClassifierOutput)

__all__ = ["PRESETS", "BertConfig", "BertForPreTraining", "BertForPreTrainingOutput",
           "BertForSequenceClassification", "BertModel", "BertModelOutput",
           "SequenceClassifierOutput"]
__version__ = "0.1.0"
