"""Masked-language-model pretraining of a tiny BERT: the whole loop on one screen.

Run from the repository root:  python examples/train_tiny.py   (under a minute on 2 cores)

It learns a WordPiece vocabulary from Moby-Dick (data/pretrain/en), cuts the book's token
stream into windows, masks 15% of each window as BERT does, and trains: forward, backward,
gradient clipping, AdamW. Only the core is used (the tokenizer, minibert.modeling,
minibert.optim). The full job, with NSP, evaluation, checkpoints and resuming, is
train_mlm.py; its loop is minibert/training.py.
"""
import time
from pathlib import Path

import numpy as np

from minibert.modeling import BertConfig, BertForPreTraining
from minibert.optim import AdamW, clip_grad_norm, linear_schedule_with_warmup
from minibert.tokenization import BasicTokenizer, WordpieceTokenizer, train_wordpiece

# Shape legend: B = batch, T = sequence length, P = masked slots per sequence,
# V = vocabulary size, N = tokens in the corpus
TEXT = Path(__file__).resolve().parent.parent / "data" / "pretrain" / "en" / "moby_dick.txt"
VOCAB_SIZE = 2000       # V: WordPiece tokens, the 5 special ones ([PAD] [UNK] ...) first
B, T = 32, 32           # sequences per batch, tokens per sequence ([CLS] + T - 1 of text)
P = round(0.15 * T)     # masked positions per sequence (BERT masks 15%)
STEPS = 1000            # optimizer steps (about 25 s on 2 cores)
LR, WARMUP = 3e-3, 100  # peak learning rate, steps of linear warmup (then linear decay)
LOG_EVERY = 100         # steps between printed losses
rng = np.random.default_rng(0)

# -- data: learn a vocabulary, then tokenize the book into one stream of ids ---------------
vocab = train_wordpiece(TEXT, VOCAB_SIZE, min_frequency=1, show_progress=False)  # [str]
token_id = {tok: i for i, tok in enumerate(vocab)}
CLS, MASK = token_id["[CLS]"], token_id["[MASK]"]
basic, wordpiece = BasicTokenizer(do_lower_case=True), WordpieceTokenizer(token_id)
ids = np.array([token_id[piece] for line in TEXT.read_text(encoding="utf-8").splitlines()
                for word in basic.tokenize(line)               # "Ishmael." -> ishmael .
                for piece in wordpiece.tokenize_word(word)],   # ishmael -> is ##h ##m ##a ##el
               dtype=np.int64)                                                 # (N,)
split = int(0.95 * len(ids))
train_ids, val_ids = ids[:split], ids[split:]   # the book's last 5% is held out
counts = np.bincount(train_ids, minlength=len(vocab)) + 1                      # (V,)
unigram = -np.log(counts / counts.sum())[val_ids].mean()  # nats, guessing by frequency
print(f"vocab {len(vocab)} tokens; corpus {len(ids):,} tokens "
      f"({len(train_ids):,} train, {len(val_ids):,} held out)")


def get_batch(source):
    """B random windows of ``source`` ((N,) int ids), each after [CLS], with P positions
    masked 80/10/10 as in BERT (Devlin et al. 2019, section 3.1).

    Returns input_ids (B, T), masked_lm_positions (B, P) and masked_lm_ids (B, P), the
    original ids at those positions: what the model has to predict.
    """
    starts = rng.integers(0, len(source) - T, size=B)                     # (B,)
    x = np.stack([source[s:s + T - 1] for s in starts])                   # (B, T-1)
    x = np.concatenate([np.full((B, 1), CLS), x], axis=1)                 # (B, T)
    positions = np.argsort(rng.random((B, T - 1)), axis=1)[:, :P] + 1     # (B, P), not [CLS]
    labels = np.take_along_axis(x, positions, axis=1)                     # (B, P)
    r = rng.random((B, P))                                                # (B, P)
    random_ids = rng.integers(5, len(vocab), size=(B, P))                 # (B, P), no special
    corrupted = np.where(r < 0.8, MASK, np.where(r < 0.9, random_ids, labels))   # (B, P)
    np.put_along_axis(x, positions, corrupted, axis=1)                    # x still (B, T)
    return x, positions, labels


# -- model and optimizer -------------------------------------------------------------------
config = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=256, max_position_embeddings=T,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # no dropout:
model = BertForPreTraining(config, seed=0, seq_relationship_head=False)  # too short to overfit
optimizer = AdamW(model.named_parameters(), lr=LR, weight_decay=0.01, correct_bias=True)
print(f"model: {model.num_parameters():,} parameters (MLM head only); a uniform guess scores "
      f"ln V = {np.log(len(vocab)):.2f} nats, a guess by token frequency {unigram:.2f}")

# -- training loop -------------------------------------------------------------------------
t0, window = time.perf_counter(), []
for step in range(1, STEPS + 1):
    lr = linear_schedule_with_warmup(step, LR, WARMUP, STEPS)
    input_ids, positions, labels = get_batch(train_ids)             # (B, T), (B, P), (B, P)
    out = model(input_ids, masked_lm_positions=positions, masked_lm_ids=labels)
    # out.prediction_logits: (B, P, V); out.loss: 0-d, mean nats over the B * P slots
    optimizer.zero_grad()              # gradients accumulate (+=): clear them once a step
    model.backward()                   # every layer in reverse; adds into each .grad
    clip_grad_norm([optimizer.flat.grad], max_norm=1.0)  # all grads share one flat buffer
    optimizer.step(lr=lr)
    window.append(float(out.loss))
    if step % LOG_EVERY == 0:
        print(f"step {step:4d}  loss {np.mean(window):.3f}  lr {lr:.2e}  "
              f"{time.perf_counter() - t0:5.1f} s")
        window = []

# -- held-out loss: the same masking on the book's last pages, never trained on -------------
model.eval()                           # dropout off (there is none here; the habit matters)
val_losses = []
for _ in range(10):
    input_ids, positions, labels = get_batch(val_ids)
    val_losses.append(float(model(input_ids, masked_lm_positions=positions,
                                  masked_lm_ids=labels).loss))
print(f"held-out loss {np.mean(val_losses):.3f} (a guess by token frequency scores "
      f"{unigram:.2f}; below it, the model reads the context)")
