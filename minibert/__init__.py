"""minibert: BERT from scratch on NumPy and CuPy, every backward pass written by hand."""
from .modeling import (PRESETS, BertConfig, BertForPreTraining, BertForPreTrainingOutput,
                       BertModel, BertModelOutput)

__all__ = ["PRESETS", "BertConfig", "BertForPreTraining", "BertForPreTrainingOutput",
           "BertModel", "BertModelOutput"]
__version__ = "0.1.0"
