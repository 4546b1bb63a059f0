"""BERT tokenization from scratch: basic tokenizer, WordPiece, the full BERT tokenizer, and a WordPiece trainer.

Public API::

    from minibert.tokenization import (
        BertTokenizer, BasicTokenizer, WordpieceTokenizer, train_wordpiece, load_vocab,
        SPECIAL_TOKENS, VocabError, AlignedIds, BatchEncoding,
    )

The tokenizer reproduces transformers' Python ``BertTokenizer`` token for token, and its
character offsets, word ids and stride windows are those of transformers' fast tokenizer
(``alignment.py``, ``encoding.py``); the trainer learns a ``vocab.txt`` from raw text (``python -m minibert.tokenization train
--help``). See ``docs/tokenization.md``.
"""

from .alignment import AlignedIds
from .basic import BasicTokenizer
from .bert import BertTokenizer
from .encoding import BatchEncoding
from .trainer import TrainedVocab, TrainingReport, train_wordpiece
from .vocab import SPECIAL_TOKENS, VocabError, load_vocab, read_vocab_tokens, write_vocab
from .wordpiece import WordpieceTokenizer

__all__ = [
    "SPECIAL_TOKENS",
    "AlignedIds",
    "BatchEncoding",
    "BasicTokenizer",
    "BertTokenizer",
    "TrainedVocab",
    "TrainingReport",
    "VocabError",
    "WordpieceTokenizer",
    "load_vocab",
    "read_vocab_tokens",
    "train_wordpiece",
    "write_vocab",
]
