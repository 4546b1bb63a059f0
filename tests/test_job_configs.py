"""The jobs' options as dataclasses: a job runs from Python without argparse, the configs
carry the scripts' defaults and range checks, and args.json round-trips."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pytest

from minibert.evaluation import EvaluationConfig
from minibert.finetuning import FinetuningConfig, run_finetuning
from minibert.pretraining import PretrainingConfig, run_pretraining

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
import evaluate  # noqa: E402
import finetune  # noqa: E402
import train_mlm  # noqa: E402

TINY = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_seq_length=16, batch_size=4, log_every=1, eval_every=100, save_every=4,
            eval_fraction=0.1, eval_instances=4, progress=False)


def test_a_tiny_pretraining_and_finetuning_run_from_python(moby30, moby_vocab, classify_task,
                                                           tmp_path, capsys, monkeypatch):
    from minibert import fast
    switched = []
    monkeypatch.setattr(fast, "set_fast_paths", lambda on: switched.append(on) or True)
    pre = tmp_path / "pre"
    summary = run_pretraining(PretrainingConfig(corpus=[str(moby30)], vocab=str(moby_vocab),
                                                output_dir=str(pre), max_steps=4, **TINY))
    for name in ("checkpoint.npz", "vocab.txt", "config.json", "args.json", "metrics.jsonl",
                 "summary.json"):
        assert (pre / name).is_file(), name
    assert summary["steps"] == 4 and math.isfinite(summary["eval_mlm_loss"])
    losses = [json.loads(l)["loss"] for l in (pre / "metrics.jsonl").read_text().splitlines()
              if json.loads(l)["kind"] == "train"]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    # args.json holds the same options a command line gives, and reads back into the config
    saved = json.loads((pre / "args.json").read_text())
    assert PretrainingConfig.from_dict(saved).to_dict() == saved
    # the default recipe: masked-LM on one line per sequence
    assert saved["objective"] == "mlm" and saved["line_by_line"] is True
    assert saved["warmup_steps"] == 1
    assert switched == [True] and "fast CPU paths: on" in capsys.readouterr().out

    ft = tmp_path / "ft"
    summary = run_finetuning(FinetuningConfig(init=str(pre), data=str(classify_task),
                                              output_dir=str(ft), max_steps=2, batch_size=8,
                                              progress=False, fast_cpu=False))
    assert switched == [True, False]
    assert capsys.readouterr().out.splitlines()[0] == "fast CPU paths: off"
    for name in ("best_model.npz", "checkpoint.npz", "labels.json", "summary.json",
                 "predictions_test.tsv"):
        assert (ft / name).is_file(), name
    assert 0.0 <= summary["test"]["accuracy"] <= 1.0 and math.isfinite(summary["test"]["loss"])
    saved = json.loads((ft / "args.json").read_text())
    assert set(saved) == set(FinetuningConfig().to_dict())


@pytest.mark.parametrize("config, parse, argv", [
    (PretrainingConfig, lambda a: train_mlm.parse_args(a)[0], []),
    (FinetuningConfig, lambda a: finetune.parse_args(a)[0], []),
    (EvaluationConfig, evaluate.parse_args, ["START"])])
def test_the_configs_hold_the_scripts_defaults(config, parse, argv):
    fresh = config(starts=argv) if config is EvaluationConfig else config()
    assert parse(argv).to_dict() == fresh.with_defaults().to_dict()


def _parser_actions(parse, argv):
    """The argparse actions of a script's parser (captured on its parse_args call)."""
    seen = {}
    real = argparse.ArgumentParser.parse_args

    def capture(self, *a, **k):
        seen["parser"] = self
        return real(self, *a, **k)
    argparse.ArgumentParser.parse_args = capture
    try:
        parse(argv)
    finally:
        argparse.ArgumentParser.parse_args = real
    return [a for a in seen["parser"]._actions if a.dest != "help"]


@pytest.mark.parametrize("config, parse, argv", [
    (PretrainingConfig, train_mlm.parse_args, []),
    (FinetuningConfig, finetune.parse_args, []),
    (EvaluationConfig, evaluate.parse_args, ["START"])])
def test_a_config_built_in_python_is_checked_as_the_command_line_is(config, parse, argv):
    probes = ["-1", "0", "0.5", "1", "2", "3", "5", "8", "100", "all", "nan", "x"]
    for action in _parser_actions(parse, argv):
        check = config.CHECKS.get(action.dest)
        if action.choices is not None:
            assert tuple(action.choices) == tuple(check), action.dest
        elif callable(action.type):
            assert check is not None, f"{action.dest}: no check in {config.__name__}.CHECKS"
            for text in probes:
                def ok(parse_type):
                    try:
                        parse_type(text)
                        return True
                    except argparse.ArgumentTypeError:
                        return False
                assert ok(action.type) == ok(check), (action.dest, text)


def test_a_bad_value_from_python_ends_in_the_scripts_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_pretraining(PretrainingConfig(max_seq_length=2, output_dir=str(tmp_path / "x")))
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "train_mlm.py: error: --max-seq-length: expected an integer >= 5, got 2")
    with pytest.raises(SystemExit):
        run_finetuning(FinetuningConfig(task="token-classification", pooling="mean"))
    assert "--pooling: for --task sequence-classification" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_changed_names_what_a_python_caller_chose():
    assert PretrainingConfig(max_steps=5, lr=2e-3).changed() == {"max_steps"}
    assert FinetuningConfig().changed() == set()


def test_the_fast_paths_line_names_what_the_switch_installs_on_the_device(monkeypatch):
    """--fast-cpu installs the CPU fast paths on NumPy and the fused kernels on CuPy: the
    log line names the one in effect, with no --device read from $MINIBERT_DEVICE."""
    from minibert.cli import fast_paths_line
    monkeypatch.delenv("MINIBERT_DEVICE", raising=False)
    assert fast_paths_line(True, None) == fast_paths_line(True, "cpu") == "fast CPU paths: on"
    assert "GPU kernels" in fast_paths_line(True, "cuda")
    assert "off" in fast_paths_line(False, "cuda") and "GPU" in fast_paths_line(False, "cuda")
    monkeypatch.setenv("MINIBERT_DEVICE", "cuda")
    assert fast_paths_line(True, None) == fast_paths_line(True, "cuda")
