"""Smoke runs of the benchmark scripts that have no test of their own: each runs end to
end on a small case and reports what it promises."""
import json

import numpy as np
import pytest

from helpers import bfloat16_or_refusal, load_bench as load


def test_bench_inference_compares_models(pretrained_run, dataset, capsys):
    bench = load("bench_inference")
    assert bench.main([str(pretrained_run), str(pretrained_run), "--data",
                       str(dataset / "test.tsv"), "--repeats", "2", "--batch-size", "4"]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    runs = [l for l in lines if "repeat" in l]
    assert len(runs) == 4 and all(r["rows"] == 16 and r["tokens_per_s"] > 0 for r in runs)
    assert all(r["ratio_to_first"] == 1.0 for r in runs[::2])
    assert len([l for l in lines if "summary" in l]) == 2


def test_bench_memory_measures_both_systems_in_their_own_process(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    assert load("bench_memory").main(["--presets", "tiny", "--batch-size", "2", "--seq-len",
                                      "16", "--vocab-size", "2000", "--steps", "1"]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    ours, theirs, ratio = lines
    assert (ours["system"], theirs["system"]) == ("minibert", "pytorch")
    for r in (ours, theirs):
        assert r["peak_rss_mib"] >= r["rss_after_setup_mib"] > 0
    assert ratio["peak_rss_ratio"] == pytest.approx(
        ours["peak_rss_mib"] / theirs["peak_rss_mib"], abs=1e-3)


def test_bench_train_step_times_each_system_in_its_own_processes(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "step.json"
    assert load("bench_train_step").main(
        ["--presets", "tiny", "--batch-size", "2", "--seq-len", "16", "--vocab-size", "2000",
         "--steps", "2", "--warmup", "1", "--rounds", "2", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert (row["rounds"], row["steps_per_round"]) == (2, 2)
    for system in ("minibert", "torch_equal_work", "transformers"):
        assert row[f"{system}_tokens_per_s"] == pytest.approx(
            2 * 16 / row[f"{system}_s_per_step"], rel=1e-2)     # s/step kept to 5 digits
    assert row["ratio_minibert_over_transformers"] == pytest.approx(
        row["minibert_tokens_per_s"] / row["transformers_tokens_per_s"], abs=1e-3)
    assert "torch_graphed_s_per_step" not in row                 # CUDA graphs: GPU only


def test_bench_train_step_times_several_precisions_in_one_process_each(tmp_path, capsys):
    """--precision fp32 fp16 with two systems: one child process per system and round times
    both precisions (a row each); the speed table gives minibert's ratio to each peer and to
    its own fp32 step, read back from the rows."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    bench = load("bench_train_step")
    children = []
    real = bench.run_child

    def counted(script, system, preset, **options):
        children.append((system, tuple(options.get("precision", ()))))
        return real(script, system, preset, **options)
    bench.run_child = counted
    out = tmp_path / "step.json"
    assert bench.main(["--presets", "tiny", "--batch-size", "2", "--seq-len", "16",
                       "--vocab-size", "1100", "--steps", "1", "--warmup", "1", "--rounds",
                       "1", "--precision", "fp32", "fp16", "--systems", "minibert",
                       "torch_equal_work", "--json", str(out)]) == 0
    assert children == [("minibert", ("fp32", "fp16")), ("torch_equal_work", ("fp32", "fp16"))]
    rows = json.loads(out.read_text())
    assert [r["precision"] for r in rows] == ["fp32", "fp16"]
    assert all("transformers_s_per_step" not in r for r in rows)
    table = bench.speed_table(rows)
    assert table[0] == "| preset | precision | minibert ms | x torch_equal_work | x own fp32 |"
    fp16 = table[3].split(" | ")
    assert float(fp16[3]) == pytest.approx(rows[1]["ratio_minibert_over_torch_equal_work"],
                                           abs=0.006)
    assert float(fp16[4].rstrip(" |")) == pytest.approx(
        rows[0]["minibert_s_per_step"] / rows[1]["minibert_s_per_step"], abs=0.006)


def test_bench_train_step_fp16_steps_run_and_tf32_needs_a_gpu(capsys):
    """The mixed-precision steps of both sides run (minibert's float16 with master weights
    and loss scaling, PyTorch's autocast + GradScaler) and give finite losses; TF32 on the
    CPU is refused with an error line."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from minibert import BertConfig
    bench = load("bench_train_step")
    config = BertConfig.from_preset("tiny", vocab_size=1100)   # make_batch draws ids >= 1000
    hf_batch, batch = bench.make_batch(np.random.default_rng(0), 2, 16, 1100)
    for step in (bench.minibert_step_fn(config, batch, "cpu", "fp16"),
                 bench.torch_step_fn(config, hf_batch, "cpu", True, "fp16"),
                 bench.torch_step_fn(config, hf_batch, "cpu", True, "bf16")):
        losses = [step() for _ in range(2)]
        assert all(np.isfinite(losses)) and losses[0] > 0
    for precision in ("tf32", "bf16"):
        with pytest.raises(SystemExit):
            bench.main(["--precision", "fp32", precision])
        assert "error: --precision tf32 and bf16 are GPU settings" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--systems", "minibert", "torch_graphed"])
    assert "error: --systems torch_graphed replays CUDA graphs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0"])
    assert "--rounds must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.gpu
def test_bench_train_step_times_minibert_on_the_gpu_through_cupy_alone(cuda, monkeypatch):
    """minibert's timed steps on the GPU synchronise through CuPy: its process never calls
    into torch's CUDA runtime (which a CPU-only torch, or one built for another CUDA, lacks)."""
    from types import SimpleNamespace
    torch = pytest.importorskip("torch")

    def no_torch_cuda():
        raise AssertionError("minibert's benchmark process called torch.cuda.synchronize")
    monkeypatch.setattr(torch.cuda, "synchronize", no_torch_cuda)
    bench = load("bench_train_step")
    precisions = ["fp32", "fp16"] + (["bf16"] if bfloat16_or_refusal() is not None else [])
    for precision in precisions:
        args = SimpleNamespace(vocab_size=1100, batch_size=2, seq_len=16, device="cuda",
                               precision=[precision], warmup=1, steps=2)
        for system in ("minibert", "minibert_graphed"):
            (times,) = bench.time_steps(system, "tiny", args).values()
            assert len(times) == 2 and all(t > 0 for t in times)
        # the MFU's ceiling, through CuPy alone too
        assert bench.cuda_gemm_peak(precision, n=64, repeats=2) > 0


def test_bench_albert_compares_the_families_at_one_width(capsys):
    """Three systems per round in their own processes; the ratios are of this round's rows
    and the parameter counts are the models' (ALBERT-tiny about half of BERT-tiny)."""
    assert load("bench_albert").main(["--batch-size", "2", "--seq-len", "16", "--vocab-size",
                                      "2000", "--warmup", "1", "--steps", "1",
                                      "--rounds", "1"]) == 0
    *rows, ratio = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    by = {r["system"]: r for r in rows}
    assert set(by) == {"bert", "albert", "albert-E=H"}
    assert by["albert"]["embedding_size"] == 64 and by["albert-E=H"]["embedding_size"] == 128
    assert by["albert"]["parameters"] < by["albert-E=H"]["parameters"] < by["bert"]["parameters"]
    from minibert import AlbertConfig, AlbertForPreTraining, BertConfig, BertForPreTraining
    assert by["bert"]["parameters"] == BertForPreTraining(
        BertConfig.from_preset("tiny", vocab_size=2000)).num_parameters()
    assert by["albert-E=H"]["parameters"] == AlbertForPreTraining(
        AlbertConfig.from_preset("tiny", vocab_size=2000, embedding_size=128)).num_parameters()
    assert ratio["albert"]["parameters"] == round(by["albert"]["parameters"]
                                                  / by["bert"]["parameters"], 3)
    assert ratio["albert"]["step_s"] == round(by["albert"]["step_s"] / by["bert"]["step_s"], 3)


def test_compare_pretraining_tables_and_plots_runs(tmp_path, capsys):
    """Minutes come from a given pace (step x s/step) or the run's clock; the table holds
    the last evaluation and the best accuracy of the chosen probe (BLiMP dev unless
    ``--probe pairs``); the plot is a PNG."""
    runs = []
    for name, accs in (("a", (52.0, 61.0, 58.0)), ("b", (50.0, 51.0, 55.0))):
        run = tmp_path / name
        run.mkdir()
        recs = [{"kind": "train", "step": 1, "loss": 9.0}] + [
            {"kind": "eval", "step": 100 * (i + 1), "elapsed_s": 30.0 * (i + 1),
             "mlm_loss": 6.0 - i, "pairs_acc": acc, "pairs_trigram_acc": 66.0,
             "blimp_acc": acc - 5, "blimp_unigram_acc": 54.0, "blimp_trigram_acc": 52.0}
            for i, acc in enumerate(accs)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        runs.append(str(run))
    png = tmp_path / "curves.png"
    compare = load("compare_pretraining").main
    assert compare(runs + ["--seconds-per-step", "0.6", "1.2", "--probe", "pairs",
                           "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| a | 300 | 3.0 | 4.000 | 58.0 | 61.0 (200) |" in out      # 300 x 0.6 s
    assert "| b | 300 | 6.0 | 4.000 | 55.0 | 55.0 (300) |" in out      # 300 x 1.2 s
    assert "word trigram on the same pairs: 66.0" in out and "unigram" not in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert compare(runs[:1] + ["--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| a | 300 | 1.5 | 4.000 | 53.0 | 56.0 (200) |" in out       # its own clock: 90 s
    assert "word unigram on the same pairs: 54.0" in out
    assert "word trigram on the same pairs: 52.0" in out


def test_bench_default_run_times_trees_in_turns_and_compares_their_losses(tmp_path, capsys):
    """Two rounds of one tree on a tiny corpus and model: a steps/s line per run, then
    the tree's median, its ratio to the first tree (itself: 1.0) and whether its losses
    equal the first tree's; bad step counts are refused with an error line."""
    from helpers import ROOT
    text = (ROOT / "data" / "pretrain" / "en" / "moby_dick.txt").read_text(encoding="utf-8")
    corpus = tmp_path / "moby8.txt"
    corpus.write_text("\n\n".join(text.split("\n\n")[:8]) + "\n", encoding="utf-8")
    bench = load("bench_default_run")
    out = tmp_path / "summary.json"
    assert bench.main(["--steps", "20", "--skip", "10", "--rounds", "2", "--json", str(out),
                       "--", "--corpus", str(corpus), "--vocab-size", "300", "--hidden-size",
                       "16", "--num-attention-heads", "2", "--intermediate-size", "32",
                       "--batch-size", "16", "--eval-pairs-per-paradigm", "2"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    runs, (summary,) = lines[:2], lines[2:]
    assert [r["round"] for r in runs] == [0, 1] and all(r["steps_per_s"] > 0 for r in runs)
    assert summary["runs"] == [r["steps_per_s"] for r in runs]
    assert summary["ratio_to_first"] == 1.0 and summary["same_losses_as_first"] is True
    assert summary["max_rel_loss_diff_to_first"] == 0.0     # one tree, one machine: its bits
    assert json.loads(out.read_text()) == [summary]
    with pytest.raises(SystemExit):
        bench.main(["--steps", "20", "--skip", "15"])
    assert "multiples of --log-every" in capsys.readouterr().err
