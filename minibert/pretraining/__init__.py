"""Pretraining data: corpus and token store, MLM masking, instances and fixed-shape batches.

The semantics follow google-research/bert ``create_pretraining_data.py``; the
organisation does not (the corpus is tokenized once into a memory-mappable store and
instances are generated on the fly, epoch by epoch). One idea per module:

* :mod:`.corpus`: reading text, the :class:`TokenStore`, held-out split, unigram baseline;
* :mod:`.exclusion`: documents left out of a corpus, named by the digest of their text;
* :mod:`.masking`: the MLM corruption every objective shares (80/10/10);
* :mod:`.batches`: epochs of instances, shuffling, resumption, fixed-shape
  :class:`PretrainingBatch`;
* how documents become sequences (BERT pairs, ALBERT segments, RoBERTa full sentences)
  is the objective's business: :mod:`minibert.objectives`.

The job (``train_mlm.py``) runs from Python too: :class:`PretrainingConfig` holds its
options and :func:`run_pretraining` (in :mod:`.job`, imported on first use) runs it::

    from minibert.pretraining import PretrainingConfig, run_pretraining
    run_pretraining(PretrainingConfig(max_steps=100, output_dir="runs/x"))

The script's command line is :mod:`.command`'s (``main(argv)``, which the script calls).

Typical use of the data pipeline::

    objective = get_objective("mlm+nsp")
    store = build_or_load_store(files, tokenizer, cache_dir, min_documents=objective.min_documents)
    train, held_out = split_documents(store, eval_fraction=0.01, min_documents=objective.min_documents)
    for batch in iterate_batches(train, VocabInfo.from_tokenizer(tokenizer), 32, 128, epoch, seed,
                                 objective=objective):
        out = model(**{k: xp.asarray(v) for k, v in batch.model_inputs().items()})
"""

from ..nn.losses import IGNORE_INDEX
from ..objectives import create_instances_from_document, truncate_seq_pair
from .batches import (Instance, PretrainingBatch, collate, count_instances, iterate_batches,
                      iterate_instances, make_eval_batches)
from .corpus import (CorpusError, DamagedStoreError, TokenStore, build_or_load_store,
                     build_store, iter_documents,
                     load_store, resolve_corpus_files, save_store, split_documents, token_counts,
                     unigram_cross_entropy)
from .masking import VocabInfo, create_masked_lm_predictions, default_max_predictions
from .config import PretrainingConfig


def __getattr__(name: str):
    """``run_pretraining`` and the job module, loaded on first use (they import the loop,
    distillation and the evaluation probes)."""
    if name in ("run_pretraining", "PretrainingWorkload"):
        from . import job
        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "IGNORE_INDEX",
    "CorpusError",
    "DamagedStoreError",
    "TokenStore",
    "VocabInfo",
    "Instance",
    "PretrainingBatch",
    "PretrainingConfig",
    "run_pretraining",
    "resolve_corpus_files",
    "iter_documents",
    "build_store",
    "save_store",
    "load_store",
    "build_or_load_store",
    "split_documents",
    "truncate_seq_pair",
    "create_instances_from_document",
    "create_masked_lm_predictions",
    "default_max_predictions",
    "iterate_instances",
    "count_instances",
    "collate",
    "iterate_batches",
    "make_eval_batches",
    "token_counts",
    "unigram_cross_entropy",
]
