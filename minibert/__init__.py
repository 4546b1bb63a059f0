"""minibert: BERT from scratch on NumPy and CuPy, every backward pass written by hand."""
from .albert import (ALBERT_PRESETS, AlbertConfig, AlbertForPreTraining,
                     AlbertForQuestionAnswering, AlbertForSequenceClassification,
                     AlbertForTokenClassification, AlbertModel)
from .heads import (BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification, QuestionAnsweringModelOutput,
                    SequenceClassifierOutput, TokenClassifierOutput)
from .modeling import (PRESETS, BertConfig, BertForPreTraining, BertForPreTrainingOutput,
                       BertModel, BertModelOutput)
from .pipelines import pipeline

__all__ = ["ALBERT_PRESETS", "AlbertConfig", "AlbertForPreTraining",
           "AlbertForQuestionAnswering", "AlbertForSequenceClassification",
           "AlbertForTokenClassification", "AlbertModel", "PRESETS", "BertConfig",
           "BertForPreTraining", "BertForPreTrainingOutput",
           "BertForQuestionAnswering", "BertForSequenceClassification",
           "BertForTokenClassification", "BertModel", "BertModelOutput",
           "QuestionAnsweringModelOutput", "SequenceClassifierOutput",
           "TokenClassifierOutput", "pipeline"]
__version__ = "0.1.0"
