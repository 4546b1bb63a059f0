#!/usr/bin/env python
"""Pretrain a BERT with masked-LM and, if asked, a sentence-level objective (Devlin et al. 2019).

    python train_mlm.py                     # tiny BERT on the embedded English corpus:
                                            # masked-LM, one corpus line per sequence
    python train_mlm.py --objective mlm+nsp # BERT's sentence pairs with next-sentence prediction
    python train_mlm.py --objective mlm     # RoBERTa's full-sentences MLM, no NSP
    python train_mlm.py --model albert      # ALBERT: shared layers, factorised embeddings,
                                            # sentence order, n-gram masking
    python train_mlm.py --preset mini --max-steps 20000 --device cuda
    python train_mlm.py --resume runs/pretrain      # continue from the last checkpoint
    python train_mlm.py --resume runs/pretrain --max-steps 6000   # go on longer (a run with
                                            # --lr-scheduler-type warmup_stable_decay)
    python train_mlm.py --init-checkpoint runs/pretrain --corpus more.txt --output-dir runs/more
                                            # a new run (new schedule) from trained weights
    python train_mlm.py --teacher runs/big --student-init every-other-layer --objective mlm
                                            # general distillation (docs/distillation.md)
    mpirun -np 2 python train_mlm.py        # data parallel over 2 processes (docs/distributed.md)

Steps: leave out the documents --exclude-documents lists (by default the Brown documents of
the POS dev and test splits), learn a WordPiece vocab from the corpus (unless --vocab is
given), tokenize the corpus into a cached token store, hold out whole documents for
evaluation, then train with AdamW, warmup + linear decay and global-norm clipping in
minibert.training's loop.
Writes to --output-dir (see minibert.runs): vocab.txt, config.json, args.json,
checkpoint.npz (every --save-every steps and at the end), metrics.jsonl ("train" and
"eval" records) and summary.json, each file atomically.
"""
from __future__ import annotations

import sys

from minibert.pretraining.command import main, parse_args

__all__ = ["main", "parse_args"]   # the options and the job: minibert/pretraining/command.py

if __name__ == "__main__":
    sys.exit(main())
