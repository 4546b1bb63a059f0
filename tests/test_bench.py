"""Smoke runs of the benchmark scripts that have no test of their own: each runs end to
end on a small case and reports what it promises."""
import json

import numpy as np
import pytest

from helpers import load_bench as load
from test_finetune import dataset, pretrained_run  # noqa: F401


def test_bench_inference_compares_models(pretrained_run, dataset, capsys):  # noqa: F811
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
            2 * 16 / row[f"{system}_s_per_step"], rel=1e-2)     # s/step kept to 4 digits
    assert row["ratio_minibert_over_transformers"] == pytest.approx(
        row["minibert_tokens_per_s"] / row["transformers_tokens_per_s"], abs=1e-3)


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
                 bench.torch_step_fn(config, hf_batch, "cpu", True, "fp16")):
        losses = [step() for _ in range(2)]
        assert all(np.isfinite(losses)) and losses[0] > 0
    with pytest.raises(SystemExit):
        bench.main(["--precision", "tf32"])
    assert "error: --precision tf32 is a GPU setting" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0"])
    assert "--rounds must be >= 1, got 0" in capsys.readouterr().err
