"""The evaluation harness: the softmax-regression probe (its gradient, its fit), the bag of
words, mean pooling, and evaluate.py end to end on a small task."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse
from hypothesis import given, settings, strategies as st

from minibert import BertConfig, BertForPreTraining
from minibert.checkpoint import save_checkpoint
from minibert.modeling import BertModel
from minibert.evaluation import harness
from minibert.evaluation.probe import (bag_of_words, fit_probe, mean_pooled_features,
                            softmax_regression_loss)
from minibert.testing import assert_gradients_match
from minibert.tokenization import BertTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import evaluate  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 6), D=st.integers(1, 5), K=st.integers(2, 4),
       l2=st.sampled_from([0.0, 0.3]), sparse=st.booleans(), seed=st.integers(0, 10 ** 6))
def test_softmax_regression_gradient(N, D, K, l2, sparse, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D))
    if sparse:
        X = scipy.sparse.csr_matrix(np.where(rng.random((N, D)) < 0.5, X, 0.0))
    y = rng.integers(0, K, N)
    params = rng.standard_normal(D * K + K)
    _, grad = softmax_regression_loss(params, X, y, K, l2)
    num = np.zeros_like(params)
    for i in range(len(params)):
        e = np.zeros_like(params)
        e[i] = 1e-6
        num[i] = (softmax_regression_loss(params + e, X, y, K, l2)[0]
                  - softmax_regression_loss(params - e, X, y, K, l2)[0]) / 2e-6
    assert_gradients_match(grad, num, "softmax regression")


def test_probe_learns_a_separable_problem_and_picks_l2_on_dev():
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, 8)) * 4
    y = rng.integers(0, 3, 300)
    X = centers[y] + rng.standard_normal((300, 8)) + 100.0   # an offset the scaling removes
    probe, dev_acc = fit_probe(X[:200], y[:200], X[200:250], y[200:250], 3)
    assert dev_acc > 0.95 and (probe.predict(X[250:]) == y[250:]).mean() > 0.95
    with pytest.raises(ValueError, match="labels must be in"):
        fit_probe(X[:10], y[:10] + 3, X[:5], y[:5], 3)


def test_bag_of_words_counts_and_unknown_words():
    X, vocab = bag_of_words(["The film, the FILM!", "a plot"])
    assert set(vocab) == {"the", "film", ",", "!", "a", "plot"}
    assert X[0, vocab["the"]] == 2 and X[0, vocab["film"]] == 2 and X[1, vocab["plot"]] == 1
    Xn, _ = bag_of_words(["unseen the"], vocab)
    assert Xn.sum() == 1 and Xn[0, vocab["the"]] == 1


def test_mean_pooling_ignores_padding():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film"]
    config = BertConfig(vocab_size=len(vocab), hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=16, max_position_embeddings=16)
    model = BertModel(config, add_pooling_layer=False, seed=0, dtype=np.float64)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "vocab.txt").write_text("\n".join(vocab) + "\n")
        tok = BertTokenizer(str(Path(d) / "vocab.txt"))
        together = mean_pooled_features(model, tok, ["good", "good good film bad"], 16,
                                        batch_size=2)
        alone = mean_pooled_features(model, tok, ["good"], 16, batch_size=1)
    np.testing.assert_allclose(together[0], alone[0], atol=1e-12)
    assert together.shape == (2, 8) and model.training


WORDS = ["the", "film", "plot", "was", "very", "not", "a"]


@pytest.fixture
def start_and_task(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad"] + WORDS
    run = tmp_path / "pretrain"
    run.mkdir()
    (run / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=16)
    save_checkpoint(run / "checkpoint.npz", BertForPreTraining(config, seed=1),
                    trainer_state={"args": {"lowercase": True}, "step": 0})
    rng = np.random.default_rng(0)
    task = tmp_path / "toy"
    task.mkdir()
    for split, n in (("train", 40), ("dev", 12), ("test", 12)):
        rows = []
        for _ in range(n):
            y = int(rng.integers(0, 2))
            rows.append(f"{'pos' if y else 'neg'}\t{' '.join(rng.choice(WORDS, 3))} "
                        f"{'good' if y else 'bad'}")
        (task / f"{split}.tsv").write_text("label\tsentence\n" + "\n".join(rows) + "\n")
    return run, task


def test_evaluate_end_to_end(start_and_task, tmp_path, capsys):
    run, task = start_and_task
    out = tmp_path / "eval"
    argv = [str(run), f"random:{run}", "--task-dir", f"toy={task}", "--tasks", "toy",
            "--budgets", "10", "all", "--seeds", "2", "--epochs", "2", "--lr", "1e-3", "3e-3",
            "--batch-size", "8", "--max-seq-length", "12", "--pooling", "mean",
            "--output-dir", str(out)]
    assert evaluate.main(argv) == 0
    configs = [json.loads(p.read_text()) for p in out.glob("runs/**/config.json")]
    assert configs and all(c["classifier_pooling"] == "mean" for c in configs)
    result = json.loads((out / "results.json").read_text())
    runs = result["runs"]
    # 2 budgets x 2 seeds x (2 starts x (2 rates x finetune + probe) + bag of words)
    assert len(runs) == 2 * 2 * 7
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in runs)
    assert {r["kind"] for r in runs} == {"finetune", "probe", "bow"}
    assert len(list(out.glob("runs/**/summary.json"))) == 2 * 2 * 2 * 2
    summary = {(r["budget"], r["start"], r["kind"]): r for r in result["summary"]}

    def tuned(start, budget):
        """(test accuracies, rate) at the rate whose mean dev accuracy is best."""
        by_lr = {lr: [r for r in runs if r["budget"] == budget and r["kind"] == "finetune"
                      and r["start"] == start and r["lr"] == lr] for lr in (1e-3, 3e-3)}
        lr = max(by_lr, key=lambda lr: np.mean([r["dev_accuracy"] for r in by_lr[lr]]))
        return [r["accuracy"] for r in by_lr[lr]], lr

    for budget in (10, None):
        for start in (str(run), f"random:{run}"):
            accs, lr = tuned(start, budget)
            row = summary[(budget, start, "finetune")]
            assert row["lr"] == lr and row["mean"] == pytest.approx(np.mean(accs))
    mine = summary[(10, str(run), "finetune")]
    rand, _ = tuned(f"random:{run}", 10)
    assert mine["margin_over_random"] == pytest.approx(mine["mean"] - np.mean(rand))
    assert "margin_over_bow" in mine and mine["seeds"] == 2
    # the budget-10 runs trained on 10 drawn rows, different per seed
    subsets = [(out / "runs" / "toy" / "10" / f"seed{s}" / "train.tsv").read_text()
               for s in range(2)]
    assert all(len(t.splitlines()) == 11 for t in subsets) and subsets[0] != subsets[1]
    assert (out / "accuracy_vs_labels.png").stat().st_size > 0
    table = capsys.readouterr().out
    assert "vs random" in table and "bag of words" in table
    # the same settings again reuse every finished fine-tuning run
    first = sorted(p.stat().st_mtime_ns for p in out.glob("runs/**/summary.json"))
    assert evaluate.main(argv) == 0
    assert sorted(p.stat().st_mtime_ns for p in out.glob("runs/**/summary.json")) == first
    # rates may be left out (or added) in the same directory: the runs at 1e-3 are reused
    # and the report covers 1e-3 alone
    lr_at = argv.index("--lr")
    assert evaluate.main(argv[:lr_at + 2] + argv[lr_at + 3:]) == 0
    assert sorted(p.stat().st_mtime_ns for p in out.glob("runs/**/summary.json")) == first
    again = json.loads((out / "results.json").read_text())
    assert {r["lr"] for r in again["runs"] if r["kind"] == "finetune"} == {1e-3}
    assert all(r["lr"] == 1e-3 for r in again["summary"] if r["kind"] == "finetune")
    # other settings in the same directory: an error line, unless --overwrite
    with pytest.raises(SystemExit):
        evaluate.main(argv[:-2] + ["--seeds", "1", "--output-dir", str(out)])
    assert "holds a harness run with other settings" in capsys.readouterr().err


def test_best_lr_is_chosen_on_dev_not_test():
    def ft(start, lr, seed, dev, test):
        return {"task": "t", "budget": None, "seed": seed, "start": start, "kind": "finetune",
                "lr": lr, "metric": "accuracy", "dev_accuracy": dev, "accuracy": test}
    # rate 1e-4 wins on mean dev (0.8 vs 0.75) though 1e-3 wins on test
    records = [ft("a", 1e-4, 0, 0.9, 0.6), ft("a", 1e-4, 1, 0.7, 0.6),
               ft("a", 1e-3, 0, 0.75, 0.9), ft("a", 1e-3, 1, 0.75, 0.9),
               # a tie on dev goes to the rate given first
               ft("b", 2e-4, 0, 0.7, 0.5), ft("b", 5e-4, 0, 0.7, 0.8),
               {"task": "t", "budget": None, "seed": 0, "start": "a", "kind": "probe",
                "metric": "accuracy", "accuracy": 0.5}]
    kept = harness.best_lr_runs(records)
    assert [r for r in kept if r["start"] == "a" and r["kind"] == "finetune"] == records[:2]
    assert [r for r in kept if r["start"] == "b"] == [records[4]]
    assert records[-1] in kept
    rows = {(r["start"], r["kind"]): r for r in harness.summarize(records)}
    assert rows[("a", "finetune")]["lr"] == 1e-4
    assert rows[("a", "finetune")]["mean"] == pytest.approx(0.6)
    assert "lr" not in rows[("a", "probe")]


def test_bad_start_and_task_are_error_lines(start_and_task, tmp_path, capsys):
    run, task = start_and_task
    with pytest.raises(SystemExit):
        evaluate.main([str(tmp_path / "missing"), "--task-dir", f"toy={task}", "--tasks", "toy"])
    assert "evaluate.py: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate.main([str(run), "--tasks", "nonesuch"])
    assert "unknown task 'nonesuch'" in capsys.readouterr().err
    assert evaluate.parse_args([str(run), "--lr", "1e-3", "2e-4", "0.001"]).lr == [1e-3, 2e-4]
    with pytest.raises(SystemExit):
        evaluate.main([str(run), "--lr", "1e-3", "nan"])
    assert "argument --lr: expected a finite number" in capsys.readouterr().err


# ------------------------------------------------------------------ tagging and QA
def write_conll(path: Path, sentences) -> None:
    path.write_text("".join("".join(f"{w}\t{t}\n" for w, t in s) + "\n" for s in sentences))


def test_most_frequent_tag_floor_by_hand(tmp_path):
    from minibert.evaluation.downstream import TaggingData, load_task
    d = tmp_path / "pos"
    d.mkdir()
    write_conll(d / "train.tsv", [[("the", "DET"), ("run", "VERB"), ("run", "VERB")],
                                  [("a", "DET"), ("run", "NOUN"), ("dog", "NOUN")],
                                  [("dogs", "NOUN"), ("run", "VERB"), ("a", "DET")],
                                  [("cats", "NOUN"), ("cats", "NOUN")]])
    write_conll(d / "dev.tsv", [[("the", "DET")]])
    # test: the/DET run/NOUN cat/NOUN fast/ADV (ADV only in test)
    write_conll(d / "test.tsv", [[("the", "DET"), ("run", "NOUN"), ("cat", "NOUN"),
                                  ("fast", "ADV")]])
    task = load_task(d)
    assert isinstance(task, TaggingData) and task.metric == "accuracy"
    assert task.tags == ["ADV", "DET", "NOUN", "VERB"]
    # all train: the -> DET, run -> VERB (3 of 4), unseen cat, fast -> NOUN (5 of 12)
    assert task.floor_scores(np.arange(4)) == {"accuracy": pytest.approx(2 / 4)}
    # sentences 1 and 3 only: run -> NOUN, overall NOUN (4 of 5): the/DET wrong (unseen)
    assert task.floor_scores(np.array([1, 3])) == {"accuracy": pytest.approx(2 / 4)}
    assert task.floor_scores(np.array([3])) == {"accuracy": pytest.approx(2 / 4)}
    assert task.floor_scores(np.array([0])) == {"accuracy": pytest.approx(1 / 4)}
    task.prepare(tmp_path / "out")
    assert (tmp_path / "out" / "labels.txt").read_text().split() == task.tags
    # entity tags: the floor and the runs report entity F1
    ner = tmp_path / "ner"
    ner.mkdir()
    write_conll(ner / "train.tsv", [[("Ann", "B-PER"), ("ran", "O")], [("Bo", "B-PER")]])
    write_conll(ner / "dev.tsv", [[("Ann", "B-PER")]])
    write_conll(ner / "test.tsv", [[("Ann", "B-PER"), ("met", "O"), ("Cy", "B-PER")]])
    task = load_task(ner)
    assert task.metric == "f1"
    # Ann/B-PER; met and Cy unseen -> the commonest tag B-PER (2 of 3): entities Ann, met,
    # Cy predicted, Ann and Cy gold: P = 2/3, R = 1
    assert task.floor_scores(np.arange(2)) == {"f1": pytest.approx(2 * (2 / 3) / (2 / 3 + 1))}


def test_first_sentence_floor_and_held_out_dev_articles(tmp_path):
    import json as _json
    from minibert.evaluation.downstream import QuestionAnsweringData, first_sentence, load_task
    assert first_sentence("Ann wrote it in 1990. Bob read it. Then?") == "Ann wrote it in 1990."
    assert first_sentence("e.g. no capital after it") == "e.g. no capital after it"
    d = tmp_path / "qa"
    d.mkdir()

    def q(qid, title, context, answer):
        return _json.dumps({"id": qid, "title": title, "context": context, "question": "?",
                            "answers": {"text": [answer],
                                        "answer_start": [context.index(answer)]}})
    ctx = "Ann wrote the book. Bob read it twice."
    (d / "train.jsonl").write_text("\n".join(q(f"t{i}", f"A{i}", ctx, "Bob")
                                             for i in range(5)) + "\n")
    (d / "dev.jsonl").write_text("\n".join([q("d1", "X", ctx, "Ann wrote the book."),
                                            q("d2", "X", ctx, "Bob read it"),
                                            q("d3", "X", ctx, "the book")]) + "\n")
    task = load_task(d)
    assert isinstance(task, QuestionAnsweringData) and task.metric == "f1"
    # no test.jsonl: dev.jsonl is the test split, the last of 5 train articles the dev split
    assert [e.id for e in task.splits["test"]] == ["d1", "d2", "d3"]
    assert [e.id for e in task.splits["dev"]] == ["t4"] and len(task.train) == 4
    task.prepare(tmp_path / "out")
    assert task.dev == tmp_path / "out" / "dev.jsonl" and task.dev.is_file()
    # first sentence "Ann wrote the book.": d1 exact; d2 no common token; d3 "the book"
    # against "ann wrote the book" (articles dropped): P 1/3, R 1 -> F1 1/2
    m = task.floor_scores(np.arange(4))
    assert m["exact_match"] == pytest.approx(1 / 3)
    assert m["f1"] == pytest.approx((1 + 0 + 0.5) / 3)


def test_floor_margins_and_metrics_in_the_summary():
    def rec(start, kind, seed, value, **more):
        return {"task": "ner", "budget": 4, "seed": seed, "start": start, "kind": kind,
                "metric": "f1", "f1": value, **more}
    records = [rec("a", "finetune", 0, 0.6, lr=1e-3, dev_f1=0.5),
               rec("a", "finetune", 1, 0.8, lr=1e-3, dev_f1=0.5),
               rec("a", "finetune", 0, 0.9, lr=3e-3, dev_f1=0.4),
               rec("a", "finetune", 1, 0.9, lr=3e-3, dev_f1=0.4),
               rec("most frequent tag", "floor", 0, 0.3), rec("most frequent tag", "floor", 1, 0.5)]
    rows = {(r["start"], r["kind"]): r for r in harness.summarize(records)}
    ft = rows[("a", "finetune")]
    assert ft["lr"] == 1e-3 and ft["metric"] == "f1"          # chosen on dev F1
    assert ft["mean"] == pytest.approx(0.7) and ft["margin_over_floor"] == pytest.approx(0.3)
    assert "margin_over_floor" not in rows[("most frequent tag", "floor")]


def test_evaluate_tagging_end_to_end(start_and_task, tmp_path, capsys):
    """A tiny start on a tiny POS task: every budget's runs, the most-frequent-tag floor
    beside them, a tag only test has (a small budget) and the plot."""
    run, _ = start_and_task
    rng = np.random.default_rng(1)
    tags = {"the": "DET", "a": "DET", "film": "NOUN", "plot": "NOUN", "was": "VERB",
            "very": "ADV", "not": "ADV", "good": "ADJ", "bad": "ADJ"}
    d = tmp_path / "pos"
    d.mkdir()
    for split, n in (("train", 24), ("dev", 6), ("test", 6)):
        sentences = [[(w, tags[w]) for w in rng.choice(["the", "a"], 1).tolist()
                      + rng.choice(["film", "plot"], 1).tolist() + ["was"]
                      + rng.choice(["very", "not", "good", "bad"], 2).tolist()]
                     for _ in range(n)]
        write_conll(d / f"{split}.tsv", sentences)
    out = tmp_path / "eval"
    argv = [str(run), f"random:{run}", "--task-dir", f"pos={d}", "--tasks", "pos",
            "--budgets", "4", "100", "--seeds", "1", "--epochs", "2", "--lr", "3e-3",
            "--batch-size", "8", "--max-seq-length", "12", "--output-dir", str(out)]
    assert evaluate.main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    runs = result["runs"]
    # budgets 4 and all (100 > 24 sentences runs as all): 2 starts + the floor each
    assert sorted((r["budget"] or 0, r["kind"]) for r in runs) == [
        (0, "finetune"), (0, "finetune"), (0, "floor"),
        (4, "finetune"), (4, "finetune"), (4, "floor")]
    assert all(r["metric"] == "accuracy" and 0 <= r["accuracy"] <= 1 for r in runs)
    assert all(0 <= r["dev_accuracy"] <= 1 for r in runs if r["kind"] == "finetune")
    floor = [r for r in runs if r["kind"] == "floor" and r["budget"] is None][0]
    assert floor["start"] == "most frequent tag" and floor["accuracy"] == pytest.approx(1.0)
    summary = [json.loads(p.read_text()) for p in out.glob("runs/pos/**/summary.json")]
    assert len(summary) == 4 and all(s["task"] == "token-classification" for s in summary)
    assert all(s["labels"] == sorted(set(tags.values())) for s in summary)
    rows = {(r["budget"], r["start"], r["kind"]): r for r in result["summary"]}
    assert "margin_over_floor" in rows[(4, str(run), "finetune")]
    assert "margin_over_random" in rows[(4, str(run), "finetune")]
    assert (out / "accuracy_vs_labels.png").stat().st_size > 0
    table = capsys.readouterr().out
    assert "most frequent tag" in table and "vs floor" in table
