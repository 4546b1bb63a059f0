"""minibert.cli: the options the jobs share (one definition, one range check each), the
rank-0-first block of the prologue, and the harness's output directory through runs.py."""
import argparse
import json
import sys
from pathlib import Path

import pytest

from minibert.checkpoint import load_checkpoint, save_checkpoint
from minibert.cli import SHARED_OPTIONS, add_options, leader_first
from minibert.evaluation.harness import open_output
from minibert.modeling import BertConfig, BertForPreTraining
from minibert.runs import RunError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import evaluate  # noqa: E402
import finetune  # noqa: E402
import train_mlm  # noqa: E402

# a value out of each numeric shared option's range, and the words of its error
BAD = {"max_steps": ("0", ">= 1"), "batch_size": ("-3", ">= 1"),
       "gradient_accumulation_steps": ("0", ">= 1"), "lr": ("nan", "finite"),
       "weight_decay": ("-1", ">= 0"), "max_grad_norm": ("inf", "finite"),
       "max_nonfinite_steps": ("0", ">= 1"), "seed": ("-1", ">= 0"),
       "temperature": ("0", "> 0"), "eval_every": ("0", ">= 1"), "log_every": ("x", "integer")}


def parser_with(**defaults):
    p = argparse.ArgumentParser(prog="job")
    add_options(p, **defaults)
    return p


def test_shared_options_take_the_jobs_defaults_and_check_their_range(capsys):
    p = parser_with(lr=1e-3, max_steps=dict(default=None, help="all epochs"), seed=7,
                    correct_bias=True, progress=True, resume=None)
    args = p.parse_args([])
    assert (args.lr, args.max_steps, args.seed, args.correct_bias, args.progress,
            args.resume) == (1e-3, None, 7, True, True, None)
    args = p.parse_args(["--no-correct-bias", "--no-progress", "--resume", "--lr", "2e-4"])
    assert (args.correct_bias, args.progress, args.resume, args.lr) == (False, False, "", 2e-4)
    for dest, (value, words) in BAD.items():
        flag = SHARED_OPTIONS[dest][0][0]
        with pytest.raises(SystemExit) as e:
            parser_with(**{dest: None}).parse_args([flag, value])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"argument {flag}:" in err and words in err, (dest, err)
    with pytest.raises(KeyError):
        parser_with(no_such_option=1)


@pytest.mark.parametrize("option,value", [("--lr", "nan"), ("--batch-size", "0"),
                                          ("--seed", "-2"), ("--max-grad-norm", "-1")])
def test_every_job_checks_a_shared_option_the_same_way(option, value, capsys):
    errors = []
    jobs = [(train_mlm.parse_args, []), (finetune.parse_args, [])]
    if option == "--batch-size":  # the harness takes only this one of them
        jobs.append((evaluate.parse_args, ["START"]))
    for parse, extra in jobs:
        with pytest.raises(SystemExit):
            parse([option, value, *extra])
        errors.append(capsys.readouterr().err.strip().splitlines()[-1].split("error: ")[1])
    assert len(errors) >= 2 and len(set(errors)) == 1, errors


class FakeComm:
    def __init__(self, rank, log):
        self.is_leader, self.rank, self.log = rank == 0, rank, log

    def barrier(self):
        self.log.append((self.rank, "barrier"))


def test_leader_first_runs_rank_0_before_the_barrier_and_the_others_after():
    log = []
    for rank in (0, 1):
        with leader_first(FakeComm(rank, log)):
            log.append((rank, "work"))
    assert log == [(0, "work"), (0, "barrier"), (1, "barrier"), (1, "work")]


def test_the_harness_output_goes_through_runs_py(tmp_path):
    settings = {"starts": ["a"], "lr": [1e-3], "seeds": 2}
    out = open_output(tmp_path / "eval", settings, overwrite=False)
    assert json.loads((out / "settings.json").read_text()) == settings
    (out / "runs").mkdir()
    # another rate only: the same harness run, its runs kept
    open_output(out, {**settings, "lr": [3e-3]}, overwrite=False)
    assert (out / "runs").is_dir()
    with pytest.raises(RunError, match="other settings"):
        open_output(out, {**settings, "seeds": 3}, overwrite=False)
    open_output(out, {**settings, "seeds": 3}, overwrite=True)
    assert not (out / "runs").exists()
    # a pretraining run's directory is not the harness's to write into
    pre = tmp_path / "pretrain"
    pre.mkdir()
    model = BertForPreTraining(BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=16,
                                          max_position_embeddings=16), seed=0)
    save_checkpoint(pre / "checkpoint.npz", model, None, {"job": "pretrain", "step": 3})
    with pytest.raises(RunError, match="checkpoint of a pretrain run"):
        open_output(pre, settings, overwrite=False)
    assert load_checkpoint(pre / "checkpoint.npz")["trainer"]["step"] == 3  # left as it was


@pytest.mark.parametrize("script", ["train_mlm.py", "finetune.py"])
def test_bfloat16_on_the_cpu_is_an_error_line_before_anything_is_written(script, tmp_path):
    """``--dtype bfloat16`` is a GPU dtype: on the CPU each job stops with one ``error:``
    line naming the option and the device, before it takes an output directory."""
    import subprocess
    out = tmp_path / "out"
    argv = [sys.executable, script, "--dtype", "bfloat16", "--device", "cpu",
            "--output-dir", str(out)]
    if script == "finetune.py":
        argv += ["--init", str(tmp_path / "run"), "--data", str(tmp_path / "data")]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"{script}: error: --dtype bfloat16 needs --device cuda: it runs on the GPU's tensor "
        "cores through CuPy; on the CPU use float32")
    assert "Traceback" not in done.stderr and not out.exists()
