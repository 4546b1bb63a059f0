"""Smoke runs of the benchmark scripts that have no test of their own: each runs end to
end on a small case and reports what it promises."""
import json

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
