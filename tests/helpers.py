"""Helpers the test modules share (not tests themselves)."""
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minibert import BertConfig, BertForPreTraining, fast_cpu
from minibert.checkpoint import save_checkpoint
from minibert.finetuning import read_conll
from minibert.hf import save_hf_directory
from minibert.runs import METRICS, MetricsLog, load_start

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
# shipped data the job tests cut small copies of
BROWN = ROOT / "data" / "tag" / "en" / "brown_pos"
SQUAD = ROOT / "data" / "qa" / "en" / "squad_v1"
UNCASED_VOCAB = ROOT / "tests" / "data" / "tokenization" / "bert-base-uncased-vocab.txt"
# the words of the toy sentiment rows (make_rows) and of their vocabulary (toy_pretrained_run)
WORDS = ["good", "great", "fine", "bad", "awful", "dull", "film", "movie", "plot", "the",
         "a", "was", "is", "very", "not", "acting", "story", ",", "."]
POS, NEG = ["good", "great", "fine"], ["bad", "awful", "dull"]


def load_bench(name: str):
    """The module bench/NAME.py (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hf_copy(run, directory: Path) -> Path:
    """A pretraining run (or checkpoint) written as a Hugging Face directory, for the
    paths that take one (transformers peers, ``--init`` of an HF directory)."""
    pre = load_start(run)
    model = BertForPreTraining(pre.config)
    model.load_state_dict(pre.state)
    return save_hf_directory(model, directory, pre.vocab_file)


@contextlib.contextmanager
def cpu_blocking(block: int | None, threads: int):
    """Within the block: element-wise CPU work in blocks of ``block`` elements (None: the
    default) over ``threads`` threads (``OMP_NUM_THREADS``); both restored afterwards."""
    old_block, old_threads = fast_cpu._CACHE_BLOCK, os.environ.get("OMP_NUM_THREADS")
    fast_cpu._CACHE_BLOCK = block or old_block
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        fast_cpu._CACHE_BLOCK = old_block
        if old_threads is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = old_threads


def tiny_pretrain_argv(corpus, vocab, out, *extra) -> list[str]:
    """train_mlm.py's options for a run of a few seconds: a 1-layer, 16-wide model on
    ``corpus`` with the given ``vocab``, 8 steps of 4 sequences of 16 tokens, a train
    record every step and a checkpoint every 4 steps, no progress bar; the model's
    sentence task (BERT's NSP, ALBERT's SOP) unless ``extra`` names another
    ``--objective``."""
    return ["--objective", "mlm+nsp", "--corpus", str(corpus), "--vocab", str(vocab),
            "--output-dir", str(out),
            "--hidden-size", "16", "--num-hidden-layers", "1", "--num-attention-heads", "2",
            "--intermediate-size", "32", "--max-seq-length", "16", "--batch-size", "4",
            "--max-steps", "8", "--log-every", "1", "--eval-every", "100",
            "--save-every", "4", "--eval-fraction", "0.1", "--eval-instances", "4",
            "--no-progress", *map(str, extra)]


def snapshot(directory: Path) -> dict:
    """Every file under ``directory``: relative path -> (size, mtime in ns, SHA-256), to
    show that a job changed nothing there."""
    import hashlib
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns,
                                             hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(Path(directory).rglob("*")) if p.is_file()}


def records(out, kind: str = "train") -> list[dict]:
    """The ``kind`` records ("train", "eval", ...) of the run directory ``out``'s
    metrics.jsonl, in file order."""
    return [r for r in MetricsLog.read(Path(out) / METRICS) if r["kind"] == kind]


def write(path: Path, text: str) -> Path:
    """``text`` written to ``path`` in UTF-8; returns ``path``."""
    path.write_text(text, encoding="utf-8")
    return path


def make_rows(n, rng, pair=False, names=("neg", "pos")) -> list[str]:
    """``n`` TSV rows ``label<TAB>sentence[<TAB>sentence_b]`` of toy sentiment: a few of
    :data:`WORDS` with one word of :data:`POS` (label ``names[1]``) or :data:`NEG`
    (``names[0]``) put in at random."""
    rows = []
    for _ in range(n):
        y = int(rng.integers(0, 2))
        words = list(rng.choice(WORDS[6:], size=int(rng.integers(2, 6))))
        words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(POS if y else NEG)))
        row = [names[y], " ".join(words)]
        if pair:
            row.append(" ".join(rng.choice(WORDS[6:], size=2)))
        rows.append("\t".join(row))
    return rows


def toy_pretrained_run(run: Path) -> Path:
    """A directory as train_mlm.py writes it (checkpoint.npz + vocab.txt): a 1-layer,
    16-wide BERT on the vocabulary of :data:`WORDS`."""
    run.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    write(run / "vocab.txt", "\n".join(vocab) + "\n")
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    save_checkpoint(run / "checkpoint.npz", BertForPreTraining(config, seed=1),
                    trainer_state={"args": {"lowercase": True}, "step": 0})
    return run


def run_ft(*argv) -> int:
    """finetune.py's ``main`` on ``argv`` (each turned into a string) without a progress
    bar; its exit status."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import finetune
    return finetune.main([*map(str, argv), "--no-progress"])


def conll(sentences) -> str:
    """Tagged sentences as CoNLL text: ``word<TAB>tag`` lines, a blank line after each."""
    return "".join("".join(f"{w}\t{t}\n" for w, t in zip(s.words, s.tags)) + "\n"
                   for s in sentences)


def cut_tagging(src: Path, dst: Path, n_train: int, n_eval: int) -> Path:
    """The first sentences of each split of the tagging task ``src``, written to ``dst``;
    dev / test keep only sentences whose tags the cut train split has."""
    dst.mkdir()
    train = read_conll(src / "train.tsv")[:n_train]
    tags = {t for s in train for t in s.tags}
    (dst / "train.tsv").write_text(conll(train), encoding="utf-8")
    for split in ("dev", "test"):
        keep = [s for s in read_conll(src / f"{split}.tsv") if set(s.tags) <= tags][:n_eval]
        (dst / f"{split}.tsv").write_text(conll(keep), encoding="utf-8")
    return dst


def tiny_mlm_run(path: Path, seed: int = 1, **recorded) -> Path:
    """A pretraining run directory: a tiny BERT on the bert-base-uncased vocabulary whose
    MLM bias is spread out, so that its top-k tokens are well separated; ``recorded``: more
    of the run's recorded arguments (``corpus``, ``exclude_documents``)."""
    path.mkdir(parents=True)
    (path / "vocab.txt").write_bytes(UNCASED_VOCAB.read_bytes())
    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    model = BertForPreTraining(config, seed=seed)
    model.cls.predictions.bias.data[:] = np.random.default_rng(seed).normal(0, 3, 30522)
    save_checkpoint(path / "checkpoint.npz", model,
                    trainer_state={"args": {"lowercase": True, **recorded}, "step": 0})
    return path


# ------------------------------------------------------------ the loop's toy task, resume
@dataclass
class Rows:
    """A batch (or all rows) of the toy classification task."""
    input_ids: np.ndarray
    attention_mask: np.ndarray
    labels: np.ndarray


class ToyTask:
    """Fixed rows in a fixed order, ``size`` per micro-batch (epoch = all rows)."""

    evaluate = None

    def __init__(self, data: Rows, size: int, nan_steps=()):
        self.data, self.size, self.nan_steps, self.calls = data, size, set(nan_steps), 0

    def batches(self, epoch, start_batch):
        n = len(self.data.labels)
        for s in range(start_batch * self.size, n, self.size):
            yield Rows(*(a[s:s + self.size] for a in
                         (self.data.input_ids, self.data.attention_mask, self.data.labels)))

    def forward(self, model, batch):
        out = model(batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels)
        self.calls += 1
        loss = out.loss * np.nan if self.calls in self.nan_steps else out.loss
        return loss, {"correct": (out.logits.argmax(-1) == batch.labels).sum()}

    def summarize(self, totals):
        return {"correct": totals.get("correct", 0.0)}

    def trainer_record(self):
        return {"job": "toy"}


def kill_when_checkpointed(cmd, ckpt: Path, timeout=120):
    """Start ``cmd``, SIGKILL it as soon as a checkpoint exists; True if it was killed."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while proc.poll() is None and time.time() - t0 < timeout:
        if ckpt.exists():
            time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.01)
    proc.wait()
    return False


def train_losses(path: Path):
    """(step, loss) of every train record of the metrics file ``path``."""
    return [(r["step"], r["loss"]) for r in MetricsLog.read(path) if r["kind"] == "train"]


# ------------------------------------------------------------ pretraining data
def position_store(doc_sentence_lengths, first_id: int = 10):
    """A TokenStore whose token ids are consecutive integers in corpus order from
    ``first_id``, so each id says where it came from; ``doc_sentence_lengths`` lists each
    document's sentence lengths (tokens)."""
    from minibert.pretraining import TokenStore
    lengths = [n for doc in doc_sentence_lengths for n in doc]
    sent = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    docs = np.concatenate([[0], np.cumsum([len(d) for d in doc_sentence_lengths])]).astype(np.int64)
    return TokenStore(np.arange(first_id, first_id + sent[-1], dtype=np.int32), sent, docs)


def word_vocab(V: int):
    """VocabInfo of [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4) and the words w5 .. w{V-1}."""
    from minibert.pretraining import VocabInfo
    words = {f"w{i}": i for i in range(5, V)}
    words.update({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])})
    return VocabInfo.from_vocab(words)


def unmasked(batch):
    """(B, T) input ids of a PretrainingBatch with the original token put back at every
    predicted position."""
    ids = batch.input_ids.copy()
    rows, slots = np.nonzero(batch.masked_lm_weights > 0)
    ids[rows, batch.masked_lm_positions[rows, slots]] = batch.masked_lm_ids[rows, slots]
    return ids


# ------------------------------------------------------------------------ distillation
def assert_student_gradients(model, kw: dict, teacher, rng, seed: int, name: str) -> None:
    """A distillation student's backward of ``dloss`` x its total loss on the inputs
    ``kw`` against central differences of every parameter (W_h in full), with the same
    dropout masks at every evaluation; the frozen ``teacher`` model learned nothing and
    stays in inference mode."""
    from minibert.testing import assert_parameter_gradients
    dloss = float(rng.uniform(0.5, 2.0))

    def loss():
        model.set_dropout_rng(np.random.default_rng(seed))
        return dloss * float(model(**kw).loss)

    loss()
    model.zero_grad()
    model.backward(dloss=dloss)
    assert_parameter_gradients(model, loss, rng, name,
                               full=lambda n: n.startswith("hidden_projection"))
    # the teacher learned nothing and kept no activations
    assert not any(p.grad.any() for p in teacher.parameters())
    assert teacher.training is False


class SharedDraws:
    """A dropout generator that gives both devices the same uniforms (drawn on the host
    from a NumPy generator seeded ``seed``, then moved to the array module ``xp``), so a
    CPU and a GPU run of a model draw the same masks."""

    def __init__(self, seed, xp):
        self.rng, self.xp = np.random.default_rng(seed), xp

    def random(self, shape, dtype=np.float64):
        return self.xp.asarray(self.rng.random(shape, dtype=dtype))


def moby_chapters(tmp_path_factory, n: int):
    """The first ``n`` chapters of the embedded Moby-Dick, as a corpus file of their own."""
    text = (ROOT / "data" / "pretrain" / "en" / "moby_dick.txt").read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp("corpus") / f"moby{n}.txt"
    path.write_text("\n\n".join(text.split("\n\n")[:n]) + "\n", encoding="utf-8")
    return path


def bfloat16_or_refusal():
    """The bfloat16 dtype, where this environment can run it (NumPy >= 2.1.2 with ml_dtypes,
    as pyproject.toml's test and gpu extras give); elsewhere (the floor run's NumPy 1.24, no
    ml_dtypes) it asserts that ``resolve_dtype`` refuses it with a message naming the
    missing piece, and returns None."""
    import pytest
    from minibert import backend
    runs = np.lib.NumpyVersion(np.__version__) >= "2.1.2" and \
        importlib.util.find_spec("ml_dtypes") is not None
    if runs:
        return backend.resolve_dtype("bfloat16", "cuda")
    with pytest.raises(backend.BackendError, match="NumPy >= 2.1.2|ml_dtypes"):
        backend.resolve_dtype("bfloat16", "cuda")
    return None
