"""minibert: BERT from scratch on NumPy and CuPy, every backward pass written by hand."""
from .modeling import (PRESETS, BertConfig, BertForPreTraining, BertForPreTrainingOutput,
                       BertForQuestionAnswering, BertForSequenceClassification,
                       BertForTokenClassification, BertModel, BertModelOutput,
                       QuestionAnsweringModelOutput, SequenceClassifierOutput,
                       TokenClassifierOutput)

__all__ = ["PRESETS", "BertConfig", "BertForPreTraining", "BertForPreTrainingOutput",
           "BertForQuestionAnswering", "BertForSequenceClassification",
           "BertForTokenClassification", "BertModel", "BertModelOutput",
           "QuestionAnsweringModelOutput", "SequenceClassifierOutput",
           "TokenClassifierOutput"]
__version__ = "0.1.0"
