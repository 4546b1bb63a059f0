"""``--report-to tensorboard``: event files beside metrics.jsonl, read back with
TensorBoard's own reader (EventAccumulator), the same scalars, no step twice on resume,
and one error line without the extra installed."""
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import finetune  # noqa: E402
import train_mlm  # noqa: E402
from helpers import tiny_pretrain_argv  # noqa: E402
from minibert.reporting import scalars  # noqa: E402
from minibert.runs import MetricsLog  # noqa: E402

pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def read_events(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} of every scalar in the event files of ``directory``."""
    acc = event_accumulator.EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def expected(metrics: Path) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list] = {}
    for record in MetricsLog.read(metrics):
        for tag, value in scalars(record):
            out.setdefault(tag, []).append((record["step"], value))
    return out


def assert_same(events: dict, want: dict) -> None:
    """Same tags, the same steps in the same order (so none twice), values to float32."""
    assert sorted(events) == sorted(want)
    for tag, points in want.items():
        assert [s for s, _ in events[tag]] == [s for s, _ in points], tag
        np.testing.assert_allclose([v for _, v in events[tag]], [v for _, v in points],
                                   rtol=1e-6, atol=1e-30, err_msg=tag)


def test_scalars_flatten_a_record():
    record = {"kind": "grad_flow", "step": 3, "grad_norm": {"a.weight": 0.5, "b": 2},
              "flag": True, "name": "x", "values": [1, 2]}
    assert list(scalars(record)) == [("grad_flow/grad_norm/a.weight", 0.5),
                                     ("grad_flow/grad_norm/b", 2.0)]


def test_resumed_log_keeps_no_step_twice(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, None, report_to="tensorboard")
    for step in range(1, 6):                  # steps 4 and 5 came after the checkpoint
        log.write({"kind": "train", "step": step, "loss": 10.0 - step})
    log.close()
    log = MetricsLog(path, resume_step=3, report_to="tensorboard")
    for step in range(4, 7):
        log.write({"kind": "train", "step": step, "loss": 100.0 + step})
    log.close()
    events = read_events(tmp_path / "tensorboard")
    assert events["train/loss"] == [(1, 9.0), (2, 8.0), (3, 7.0), (4, 104.0), (5, 105.0),
                                    (6, 106.0)]
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert_same(events, expected(path))


def crash_after_checkpoint(monkeypatch, run, step=4):
    """``run()`` stopped by a Ctrl-C right after its step-``step`` checkpoint (status 130)."""
    from minibert import training
    real_save = training.save_checkpoint

    def save_then_crash(path, model, optimizer, state, **kw):
        real_save(path, model, optimizer, state, **kw)
        if state["step"] == step:
            raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(training, "save_checkpoint", save_then_crash)
    with pytest.raises(SystemExit, match="130"):
        run()
    monkeypatch.setattr(training, "save_checkpoint", real_save)


def test_pretraining_run_crashed_and_resumed(moby30, moby_vocab, tmp_path, monkeypatch):
    out = tmp_path / "run"
    argv = tiny_pretrain_argv(moby30, moby_vocab, out, "--report-to", "tensorboard",
                              "--log-grad-norms", "2", "--eval-every", "4")
    crash_after_checkpoint(monkeypatch, lambda: train_mlm.main(argv))
    assert train_mlm.main([*argv, "--resume"]) == 0
    events = read_events(out / "tensorboard")
    want = expected(out / "metrics.jsonl")
    assert_same(events, want)
    assert [s for s, _ in events["train/loss"]] == list(range(1, 9))
    for tag in ("train/lr", "train/grad_norm", "train/tokens_per_s", "eval/mlm_loss"):
        assert tag in events, tag
    assert any(t.startswith("grad_flow/grad_norm/") for t in events)


def test_finetuning_run(dataset, pretrained_run, tmp_path):
    out = tmp_path / "ft"
    assert finetune.main(["--init", str(pretrained_run), "--data", str(dataset),
                          "--output-dir", str(out), "--max-steps", "4", "--batch-size", "8",
                          "--max-seq-length", "16", "--log-every", "1", "--no-progress",
                          "--report-to", "tensorboard"]) == 0
    events = read_events(out / "tensorboard")
    assert_same(events, expected(out / "metrics.jsonl"))
    assert "eval/dev_accuracy" in events and len(events["train/loss"]) == 4


@pytest.mark.parametrize("script", ["train_mlm", "finetune"])
def test_without_the_extra_one_error_line(script, monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)      # import fails
    main = {"train_mlm": train_mlm.main, "finetune": finetune.main}[script]
    with pytest.raises(SystemExit) as e:
        main(["--output-dir", str(tmp_path / "x"), "--report-to", "tensorboard"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if "error:" in line] == err[-1:]
    assert "tensorboard needs the tensorboardX package" in err[-1]
    assert "pip install 'minibert[tensorboard]'" in err[-1]
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit):
        main(["--report-to", "wandb"])
    assert "invalid choice 'wandb'" in capsys.readouterr().err
