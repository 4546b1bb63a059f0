"""ALBERT in the jobs: train_mlm.py --model albert (its files, defaults, exact resume, its
checkpoint read back as an ALBERT), fine-tuning from such a run (every task's ALBERT head,
the export that transformers loads), an ALBERT student distilled from a BERT teacher (the
float64 gradients of its loss, attention transfer included, and a run), and the error
lines of options that do not fit the model."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibert import (AlbertConfig, AlbertForPreTraining, AlbertForQuestionAnswering,
                      AlbertForSequenceClassification, AlbertForTokenClassification,
                      AlbertModel, BertConfig, BertForPreTraining, pipeline)
from minibert.auto import bert_role, config_from_dict, model_class
from minibert.checkpoint import load_checkpoint
from minibert.distillation import (AlbertDistillationModel, DistillationWeights, Teacher,
                                   student_class)
from minibert.finetuning.tasks import make_task, task_for_model
from minibert.hf import load_pretrained_weights
from minibert.runs import load_start
from minibert.testing import albert_configs, seeds, token_batches

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import finetune  # noqa: E402
import train_mlm  # noqa: E402
from minibert.pretraining import batches as batches_module  # noqa: E402
from helpers import records  # noqa: E402
from helpers import assert_student_gradients  # noqa: E402


def args_for(corpus, out, *extra):
    return ["--corpus", str(corpus), "--output-dir", str(out), "--vocab-size", "300",
            "--model", "albert", "--hidden-size", "32", "--num-hidden-layers", "3",
            "--num-hidden-groups", "2", "--embedding-size", "16", "--max-seq-length", "32",
            "--batch-size", "4", "--max-steps", "8", "--log-every", "1", "--eval-every", "4",
            "--save-every", "4", "--eval-fraction", "0.1", "--eval-instances", "16",
            "--eval-pairs-per-paradigm", "2", "--no-progress", *extra]


CURVE_KEYS = ("step", "epoch", "lr", "loss", "mlm_loss", "sop_loss", "mlm_acc", "sop_acc",
              "grad_norm")


def curve(out):
    return [{k: r[k] for k in CURVE_KEYS} for r in records(out, "train")]


@pytest.fixture(scope="module")
def albert_run(moby30, tmp_path_factory):
    out = tmp_path_factory.mktemp("albert") / "run"
    assert train_mlm.main(args_for(moby30, out)) == 0
    return out


@pytest.fixture(scope="module")
def bert_run(moby30, tmp_path_factory):
    """A tiny BERT run (2 heads: a teacher for attention transfer)."""
    out = tmp_path_factory.mktemp("bert") / "run"
    assert train_mlm.main(["--corpus", str(moby30), "--output-dir", str(out), "--vocab-size",
                           "300", "--hidden-size", "32", "--num-hidden-layers", "2",
                           "--num-attention-heads", "2", "--max-seq-length", "32",
                           "--batch-size", "4", "--max-steps", "2", "--eval-fraction", "0",
                           "--eval-pairs-per-paradigm", "0", "--no-progress"]) == 0
    return out


# -- pretraining ------------------------------------------------------------------------------

def test_albert_run_writes_everything_and_loads_back_as_albert(albert_run):
    for name in ("vocab.txt", "checkpoint.npz", "metrics.jsonl", "summary.json",
                 "config.json", "args.json"):
        assert (albert_run / name).is_file(), name
    saved = json.loads((albert_run / "args.json").read_text())
    # ALBERT's recipe where the command line left the option alone
    assert (saved["model"], saved["objective"], saved["max_ngram"], saved["hidden_act"]) == \
        ("albert", "mlm+sop", 3, "gelu_new")
    config = json.loads((albert_run / "config.json").read_text())
    assert config["model_type"] == "albert"
    assert (config["embedding_size"], config["num_hidden_groups"]) == (16, 2)
    evals = records(albert_run, "eval")
    assert [r["step"] for r in evals] == [4, 8]
    assert all(0 <= r["sop_acc"] <= 1 and np.isfinite(r["sop_loss"]) for r in evals)

    start = load_start(albert_run)
    assert isinstance(start.config, AlbertConfig)
    assert start.config == config_from_dict(config)
    assert {k.split(".")[0] for k in start.state} == {"albert", "predictions", "sop_classifier"}
    model = AlbertForPreTraining(start.config)
    assert load_pretrained_weights(model, start.state)["new"] == []
    summary = json.loads((albert_run / "summary.json").read_text())
    assert summary["parameters"] == model.num_parameters()
    # the samples of the last evaluation are what the run's fill-mask pipeline answers
    texts = [s["text"] for s in records(albert_run, "samples")[-1]["samples"]]
    filled = pipeline("fill-mask", albert_run)(texts, top_k=3)
    assert [[t for t, _ in s["top"]] for s in records(albert_run, "samples")[-1]["samples"]] \
        == [[r["token_str"] for r in f] for f in filled]
    assert isinstance(pipeline("feature-extraction", albert_run).model, AlbertModel)


def test_albert_resume_after_a_crash_continues_the_same_curve(albert_run, moby30, tmp_path,
                                                             monkeypatch):
    crashed = tmp_path / "crashed"
    from minibert import training
    real_save, real_mask = training.save_checkpoint, batches_module.create_masked_lm_predictions
    ngrams = set()

    def save_then_crash(path, model, optimizer, state, **kw):
        real_save(path, model, optimizer, state, **kw)
        if state["step"] == 4:
            raise KeyboardInterrupt("simulated crash after the step-4 checkpoint")

    def spy(*args, **kwargs):
        ngrams.add(args[6])                              # max_ngram, after whole_word_mask
        return real_mask(*args, **kwargs)

    monkeypatch.setattr(batches_module, "create_masked_lm_predictions", spy)
    monkeypatch.setattr(training, "save_checkpoint", save_then_crash)
    with pytest.raises(SystemExit, match="130"):
        train_mlm.main(args_for(moby30, crashed))
    monkeypatch.setattr(training, "save_checkpoint", real_save)
    # a bare --resume: the model, its sizes and the recipe come from the run
    assert train_mlm.main(["--resume", str(crashed), "--no-progress"]) == 0

    assert ngrams == {3}                                # ALBERT's n-gram masking ran
    assert curve(crashed) == curve(albert_run)
    a, b = (load_checkpoint(d / "checkpoint.npz") for d in (albert_run, crashed))
    assert isinstance(b["config"], AlbertConfig) and a["config"] == b["config"]
    for k, v in a["model"].items():
        np.testing.assert_array_equal(v, b["model"][k], err_msg=k)


# -- fine-tuning ------------------------------------------------------------------------------

@pytest.mark.parametrize("task, cls", [("sequence-classification",
                                        AlbertForSequenceClassification),
                                       ("token-classification", AlbertForTokenClassification),
                                       ("question-answering", AlbertForQuestionAnswering)])
def test_every_task_builds_its_albert_head_on_the_pretrained_encoder(albert_run, task, cls):
    start = load_start(albert_run)
    labels = None if task == "question-answering" else ["a", "b", "c"]
    model, report = make_task(task).model_from_start(start, labels)
    assert type(model) is cls and isinstance(model.config, AlbertConfig)
    assert report["new"] and all(not k.startswith("albert.") or "pooler" in k
                                 for k in report["new"])
    assert bert_role(cls.__name__) == make_task(task).model_class.__name__
    assert model_class(start.config, make_task(task).model_class) is cls


def test_finetune_from_an_albert_run_exports_to_transformers(albert_run, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "dev", "test"):
        rows = (ROOT / "data" / "classify" / "en" / "movie_reviews" / f"{split}.tsv"
                ).read_text(encoding="utf-8").splitlines()[:17]
        (data / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    out, hf_dir = tmp_path / "ft", tmp_path / "hf"
    assert finetune.main(["--init", str(albert_run), "--data", str(data), "--output-dir",
                          str(out), "--epochs", "1", "--batch-size", "8", "--max-seq-length",
                          "24", "--no-progress", "--predict", "a fine film",
                          "--export-hf", str(hf_dir)]) == 0
    printed = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[{")]
    start = load_start(out)
    assert isinstance(start.config, AlbertConfig) and task_for_model(start).name == \
        "sequence-classification"
    assert finetune.main(["--model", str(out), "--predict", "a fine film"]) == 0
    assert [l for l in capsys.readouterr().out.splitlines() if l.startswith("[{")] == printed
    dev = json.loads((out / "summary.json").read_text())["dev"]
    assert finetune.main(["--resume", str(out), "--no-progress"]) == 0   # rebuilt as ALBERT
    assert json.loads((out / "summary.json").read_text())["dev"] == dev

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AlbertForSequenceClassification.from_pretrained(hf_dir).eval()
    from minibert.tokenization import BertTokenizer
    enc = BertTokenizer(out / "vocab.txt")("a fine film", return_tensors="np")
    with torch.no_grad():
        p = torch.softmax(hf(**{k: torch.from_numpy(v[None]) for k, v in enc.items()}).logits,
                          -1)[0].numpy()
    scores = {s["label"]: s["score"] for s in json.loads(printed[0])}
    labels = [hf.config.id2label[i] for i in range(len(p))]
    np.testing.assert_allclose([scores[l] for l in labels], p, atol=1e-5)
    # the exported directory is itself a start: an HF ALBERT directory
    assert finetune.main(["--model", str(hf_dir), "--predict", "a fine film"]) == 0
    again = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[{")]
    assert [s["label"] for s in json.loads(again[0])] == \
        [s["label"] for s in json.loads(printed[0])]


# -- distillation -----------------------------------------------------------------------------

@settings(max_examples=5, deadline=None)
@given(data=st.data(), hs=st.integers(2, 3), sop=st.booleans(), seed=seeds)
def test_albert_student_gradients_of_the_total_loss(data, hs, sop, seed):
    """Every parameter of an ALBERT student (shared groups, E <= H) and W_h against central
    differences of the weighted total: soft targets, its own MLM (+ SOP), cosine and pooled
    cosine through W_h, and attention transfer into its last depth, whose group serves
    other depths too; the BERT teacher is frozen."""
    config = data.draw(albert_configs(max_hidden=8, max_positions=6, min_hidden=4))
    tcfg = BertConfig(vocab_size=config.vocab_size, hidden_size=config.num_attention_heads * hs,
                      num_hidden_layers=2, num_attention_heads=config.num_attention_heads,
                      intermediate_size=7, max_position_embeddings=config.max_position_embeddings)
    teacher = BertForPreTraining(tcfg, seed=seed % 997, dtype=np.float64,
                                 seq_relationship_head=False)
    rng = np.random.default_rng(seed)
    weights = DistillationWeights(temperature=2.0, alpha_ce=1.3, alpha_mlm=0.7, alpha_cos=1.1,
                                  alpha_att=0.9, alpha_pooled=0.8)
    cls = student_class(config)
    assert cls is AlbertDistillationModel and student_class(tcfg) is not cls
    model = cls(config, Teacher(teacher), weights, seed=seed % 1000, dtype=np.float64,
                seq_relationship_head=sop)
    batch = data.draw(token_batches(config, max_batch=3))
    kw = {k: v for k, v in batch.model_inputs().items() if sop or k != "next_sentence_label"}
    assert_student_gradients(model, kw, teacher, rng, seed, "albert student")


def test_an_albert_student_distils_from_a_bert_teacher(bert_run, moby30, tmp_path):
    out = tmp_path / "student"
    assert train_mlm.main(["--corpus", str(moby30), "--output-dir", str(out), "--teacher",
                           str(bert_run), "--model", "albert", "--hidden-size", "16",
                           "--num-attention-heads", "2", "--num-hidden-layers", "2",
                           "--alpha-att", "1.0", "--max-seq-length", "32", "--batch-size",
                           "4", "--max-steps", "4", "--log-every", "1", "--eval-every", "4",
                           "--eval-fraction", "0.1", "--eval-instances", "8",
                           "--eval-pairs-per-paradigm", "0", "--no-progress"]) == 0
    train = records(out, "train")
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    for r in train:
        assert all(np.isfinite(r[k]) for k in ("kl_loss", "cos_loss", "att_loss", "sop_loss"))
    start = load_start(out)
    assert isinstance(start.config, AlbertConfig) and start.config.hidden_size == 16
    assert "hidden_projection.weight" in start.state   # trained with the student, unused after
    assert json.loads((out / "summary.json").read_text())["teacher"] == str(bert_run)


# -- options that do not fit ------------------------------------------------------------------

def test_model_defaults_follow_the_model_and_yield_to_given_options():
    def parsed(*argv):
        return train_mlm.parse_args(list(argv))[0]

    bert, albert = parsed(), parsed("--model", "albert")
    assert (bert.objective, bert.line_by_line, bert.max_ngram, bert.hidden_act) == (
        "mlm", True, 1, "gelu")
    assert (albert.objective, albert.line_by_line, albert.max_ngram, albert.hidden_act) == (
        "mlm+sop", False, 3, "gelu_new")
    # the line-by-line format goes with the recipe's objective: a named one packs its
    # sequences, unless --line-by-line is given too; --no-line-by-line packs the recipe's
    for argv, want in ((("--objective", "mlm+nsp"), ("mlm+nsp", False)),
                       (("--objective", "mlm"), ("mlm", False)),
                       (("--objective", "mlm", "--line-by-line"), ("mlm", True)),
                       (("--no-line-by-line",), ("mlm", False))):
        config = parsed(*argv)
        assert (config.objective, config.line_by_line) == want, argv
    given = parsed("--model", "albert", "--objective", "mlm", "--max-ngram", "1",
                   "--hidden-act", "gelu")
    assert (given.objective, given.max_ngram, given.hidden_act) == ("mlm", 1, "gelu")
    assert parsed("--max-ngram", "2").max_ngram == 2            # n-grams for BERT too


@pytest.mark.parametrize("argv, message", [
    (("--embedding-size", "16"), "--embedding-size: ALBERT options, only with --model albert"),
    (("--num-hidden-groups", "2", "--inner-group-num", "2"),
     "--num-hidden-groups, --inner-group-num: ALBERT options"),
    (("--model", "albert", "--embedding-size", "64"),
     "AlbertConfig.embedding_size (64) must be at most hidden_size (32)"),
    (("--model", "albert", "--num-hidden-groups", "3"),
     "AlbertConfig.num_hidden_groups (3) must be at most num_hidden_layers (2)"),
    (("--model", "albert", "--norm-position", "pre"), "--norm-position pre: ALBERT"),
    (("--model", "albert", "--objective", "electra"), "--objective electra"),
    (("--max-ngram", "0"), "--max-ngram"),
    (("--init-checkpoint", "ALBERT"), "holds a model of model_type 'albert', this run trains "
                                      "--model bert (give --model albert)"),
    (("--model", "albert", "--init-checkpoint", "BERT"),
     "holds a model of model_type 'bert', this run trains --model albert"),
    (("--teacher", "ALBERT", "--model", "albert"), "a teacher is a BERT"),
    (("--model", "albert", "--teacher", "BERT", "--student-init", "every-other-layer"),
     "--student-init every-other-layer builds the student from the teacher's BERT weights"),
])
def test_options_that_do_not_fit_the_model_get_one_error_line(
        albert_run, bert_run, moby30, tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    paths = {"ALBERT": str(albert_run), "BERT": str(bert_run)}
    argv = [paths.get(a, a) for a in argv]
    with pytest.raises(SystemExit) as e:
        train_mlm.main(["--corpus", str(moby30), "--output-dir", str(out), "--hidden-size",
                        "32", "--num-hidden-layers", "2", "--no-progress", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1 and "Traceback" not in err
    assert not (out / "checkpoint.npz").exists()


def test_a_checkpoint_of_the_other_family_is_refused_on_resume(albert_run, capsys):
    from minibert.checkpoint import CheckpointError, check_same_config
    with pytest.raises(SystemExit) as e:
        train_mlm.main(["--resume", str(albert_run), "--model", "bert", "--no-progress"])
    assert e.value.code == 2
    assert "--model: checkpoint 'albert', now 'bert'" in capsys.readouterr().err
    albert = load_checkpoint(albert_run / "checkpoint.npz", arrays=False)["config"]
    bert = BertConfig(hidden_size=32, num_attention_heads=1)
    with pytest.raises(CheckpointError, match="model_type 'albert'; this run builds 'bert'"):
        check_same_config(albert, bert, "c.npz")
    # checkpoints written before model_type was recorded read as BERT
    assert config_from_dict(bert.to_dict()) == bert
