"""What a result was computed from (minibert.provenance): the corpus and vocab fingerprint
a pretraining checkpoint records and --resume checks, and evaluate.py's reuse of
fine-tuning runs keyed by the start's content, not its path."""
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import train_mlm  # noqa: E402
from minibert import BertConfig, BertForPreTraining, provenance  # noqa: E402
from minibert.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from minibert.evaluation import EvaluationConfig, harness  # noqa: E402
from minibert.runs import load_start  # noqa: E402


@pytest.fixture
def corpus(tmp_path):
    """The first 30 chapters of Moby-Dick from data/, as a corpus file of its own."""
    text = (ROOT / "data" / "pretrain" / "en" / "moby_dick.txt").read_text(encoding="utf-8")
    path = tmp_path / "corpus" / "moby.txt"
    path.parent.mkdir()
    path.write_text("\n\n".join(text.split("\n\n")[:30]) + "\n", encoding="utf-8")
    return path


def args_for(corpus, out, *extra):
    return ["--corpus", str(corpus), "--output-dir", str(out), "--vocab-size", "300",
            "--hidden-size", "16", "--num-hidden-layers", "1", "--max-seq-length", "24",
            "--batch-size", "4", "--max-steps", "2", "--eval-every", "2", "--save-every", "2",
            "--eval-instances", "8", "--no-progress", *extra]


# ---------------------------------------------------------------------------------------
# Fingerprints
# ---------------------------------------------------------------------------------------

def test_file_fingerprint_is_the_content_not_the_path(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"one\ntwo\n")
    b.write_bytes(b"one\ntwo\n")
    assert provenance.file_fingerprint(a) == provenance.file_fingerprint(b)
    b.write_bytes(b"one\ntwO\n")
    assert provenance.file_fingerprint(a) != provenance.file_fingerprint(b)
    assert provenance.files_fingerprint([a, b]) != provenance.files_fingerprint([b, a])


def test_a_big_file_is_sampled_and_read_in_part(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "FULL_HASH_BYTES", 1 << 16)
    monkeypatch.setattr(provenance, "SAMPLES", 4)
    monkeypatch.setattr(provenance, "SAMPLE_BYTES", 1 << 10)
    provenance._fingerprint.cache_clear()
    path = tmp_path / "big.txt"
    data = bytearray(np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8))
    path.write_bytes(data)
    reads = []
    monkeypatch.setattr(provenance, "open", lambda *a, **k: _Counting(open(*a, **k), reads),
                        raising=False)
    first = provenance.file_fingerprint(path)
    assert first.startswith("sampled:") and sum(reads) == 4 * (1 << 10)
    stat = path.stat()
    data[-1] ^= 0xFF  # inside the last sample; size and mtime kept
    path.write_bytes(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    provenance._fingerprint.cache_clear()  # as a new process: the stat is unchanged
    assert provenance.file_fingerprint(path) != first
    provenance._fingerprint.cache_clear()


class _Counting:
    """A file whose reads are counted (the sampled fingerprint's bound)."""

    def __init__(self, f, reads):
        self.f, self.reads = f, reads

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def seek(self, offset):
        return self.f.seek(offset)

    def read(self, n=-1):
        data = self.f.read(n)
        self.reads.append(len(data))
        return data


# ---------------------------------------------------------------------------------------
# --resume on changed data
# ---------------------------------------------------------------------------------------

def test_checkpoint_records_the_data_and_resume_refuses_a_changed_corpus(
        corpus, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    from minibert import training
    real_save = training.save_checkpoint

    def save_then_crash(path, model, optimizer, state, **kw):
        real_save(path, model, optimizer, state, **kw)
        if state["step"] == 2:
            raise KeyboardInterrupt("simulated crash after the step-2 checkpoint")

    monkeypatch.setattr(training, "save_checkpoint", save_then_crash)
    with pytest.raises(SystemExit) as stop:            # job_main: Ctrl-C ends with 130
        train_mlm.main(args_for(corpus, out, "--max-steps", "4"))
    assert stop.value.code == 130
    monkeypatch.setattr(training, "save_checkpoint", real_save)
    record = load_checkpoint(out / "checkpoint.npz")["trainer"]["data"]
    assert record == provenance.data_fingerprint([corpus], out / "vocab.txt")
    assert record["corpus"].startswith("sha256:") and record["vocab"].startswith("sha256:")
    # the example: the corpus file changed under the run
    with open(corpus, "a", encoding="utf-8") as f:
        f.write("\nA new document that the run never saw.\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train_mlm.main(args_for(corpus, out, "--max-steps", "4", "--resume"))
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("train_mlm.py: error: cannot resume ") and "corpus changed" in err
    assert "--allow-data-change" in err
    assert load_checkpoint(out / "checkpoint.npz")["trainer"]["step"] == 2
    # allowed: it continues, says so, and the checkpoint records the new data
    assert train_mlm.main(args_for(corpus, out, "--max-steps", "4", "--resume",
                                   "--allow-data-change")) == 0
    assert "warning: resuming" in capsys.readouterr().err
    trainer = load_checkpoint(out / "checkpoint.npz")["trainer"]
    assert trainer["step"] == 4 and trainer["data"]["corpus"] != record["corpus"]
    assert trainer["data"]["vocab"] == record["vocab"]
    # the permission belonged to that invocation: the next resume checks again
    seen = corpus.read_bytes()
    with open(corpus, "a", encoding="utf-8") as f:
        f.write("\nAnd another.\n")
    with pytest.raises(SystemExit):
        train_mlm.main(args_for(corpus, out, "--max-steps", "4", "--resume"))
    assert "corpus changed" in capsys.readouterr().err
    # the data the checkpoint records, restored: resumes without a word
    corpus.write_bytes(seen)
    assert train_mlm.main(args_for(corpus, out, "--max-steps", "4", "--resume")) == 0
    assert "warning" not in capsys.readouterr().err


def test_left_out_documents_are_said_recorded_and_checked_on_resume(corpus, tmp_path, capsys):
    from minibert.pretraining.exclusion import document_digest
    docs = [d.split("\n") for d in corpus.read_text(encoding="utf-8").strip().split("\n\n")]
    listed = tmp_path / "exclude.tsv"
    listed.write_text(f"{document_digest(docs[3])}\tchapter three\n", encoding="utf-8")
    out = tmp_path / "run"
    capsys.readouterr()
    assert train_mlm.main(args_for(corpus, out, "--exclude-documents", str(listed))) == 0
    printed = capsys.readouterr().out
    assert (f"corpus: left out 1 of the 1 documents listed in {listed} ({len(docs[3])} "
            "sentences; --exclude-documents none keeps them): chapter three") in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["excluded_documents"]["left_out"] == [
        {"name": "chapter three", "sha256": document_digest(docs[3]), "sentences": len(docs[3])}]
    assert json.loads((out / "args.json").read_text())["exclude_documents"] == [str(listed)]
    record = load_checkpoint(out / "checkpoint.npz")["trainer"]["data"]
    assert record == provenance.data_fingerprint([corpus], out / "vocab.txt",
                                                 [document_digest(docs[3])])
    assert record["excluded"] != provenance.data_fingerprint(
        [corpus], out / "vocab.txt", [document_digest(docs[4])])["excluded"]
    # without a list nothing is left out, and nothing is recorded
    plain = tmp_path / "plain"
    assert train_mlm.main(args_for(corpus, plain, "--exclude-documents", "none")) == 0
    assert "left out" not in capsys.readouterr().out
    assert "excluded" not in load_checkpoint(plain / "checkpoint.npz")["trainer"]["data"]
    assert "excluded_documents" not in json.loads((plain / "summary.json").read_text())
    # the list changed under the run: a resume would train on other documents
    listed.write_text(f"{document_digest(docs[4])}\tchapter four\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        train_mlm.main(args_for(corpus, out, "--resume"))
    err = capsys.readouterr().err
    assert "cannot resume" in err and "excluded documents changed" in err
    # restored: it resumes and leaves the same document out
    listed.write_text(f"{document_digest(docs[3])}\tchapter three\n", encoding="utf-8")
    assert train_mlm.main(args_for(corpus, out, "--resume")) == 0
    assert "left out 1 of the 1" in capsys.readouterr().out


def test_resume_refuses_a_replaced_vocab(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_mlm.main(args_for(corpus, out)) == 0
    tokens = (out / "vocab.txt").read_text(encoding="utf-8").split("\n")
    tokens[-2], tokens[-3] = tokens[-3], tokens[-2]  # two ids swapped: same size, other vocab
    (out / "vocab.txt").write_text("\n".join(tokens), encoding="utf-8")
    with pytest.raises(SystemExit):
        train_mlm.main(args_for(corpus, out, "--resume"))
    assert "vocab changed" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# evaluate.py: runs reused by the start's content
# ---------------------------------------------------------------------------------------

FAKE_FINETUNE = textwrap.dedent("""\
    import json, os, pathlib, sys
    argv = sys.argv[1:]
    out = pathlib.Path(argv[argv.index("--output-dir") + 1])
    out.mkdir(parents=True, exist_ok=True)
    with open(os.environ["CALLS_LOG"], "a") as f:
        f.write(argv[argv.index("--init") + 1] + "\\n")
    (out / "summary.json").write_text(json.dumps({"dev": {"accuracy": 0.5},
                                                  "test": {"accuracy": 0.5}}))
    """)


def _start(path: Path, seed: int) -> Path:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film"]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = BertConfig(vocab_size=len(vocab), hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=16, max_position_embeddings=16)
    save_checkpoint(path / "checkpoint.npz", BertForPreTraining(config, seed=seed),
                    trainer_state={"args": {"lowercase": True}, "step": 0})
    return path


def test_evaluate_reuses_runs_by_the_starts_content_not_its_path(tmp_path, monkeypatch):
    task = tmp_path / "toy"
    task.mkdir()
    for split in ("train", "dev", "test"):
        (task / f"{split}.tsv").write_text("label\tsentence\npos\tgood film\nneg\tbad film\n")
    script = tmp_path / "fake_finetune.py"
    script.write_text(FAKE_FINETUNE)
    out = tmp_path / "eval"
    args = EvaluationConfig(budgets=[None], seeds=1, lr=[1e-3], finetune=True, probe=False,
                            epochs=1, batch_size=8, max_seq_length=12, pooling="mean",
                            device=None)
    start = _start(tmp_path / "start", seed=1)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("CALLS_LOG", str(log))

    def evaluate(path):
        starts = {str(path): load_start(path, "START"), f"random:{path}": load_start(path)}
        harness.evaluate_task(args, "toy", task, starts, out, script)
        return log.read_text().splitlines() if log.exists() else []

    assert evaluate(start) == [str(start), str(start)]  # the start and random:start
    assert evaluate(start) == [str(start), str(start)]  # the same start: both reused
    copy = Path(shutil.copytree(start, tmp_path / "copy"))
    assert len(evaluate(copy)) == 2  # the same content at another path: reused
    # the example: another model at the same path runs again (its random: twin
    # too, whose config and vocab are the start's)
    _start(start, seed=2)
    assert evaluate(start) == [str(start)] * 4
    assert len(list(out.glob("runs/**/summary.json"))) == 4
