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
