"""The evaluation harness (``evaluate.py``): what a starting point is worth downstream, on
every kind of task ``finetune.py`` has (:mod:`.downstream`: sentence classification,
tagging, question answering). The comparison is only fair when every start has the same
architecture and vocabulary, its own learning rate chosen on dev, several seeds, label
budgets from few to all, and floors beside it; the harness holds each start to that
(``docs/payoff.md`` has the results). It reads the task directories and starts it is
given; ``evaluate.py`` names the defaults, the tasks the repository ships under ``data/``.

For every (task, label budget, seed) the harness draws the train rows (sentences,
questions; ``Task.draw``), fine-tunes every start at every learning rate
(:func:`run_finetune`: ``finetune.py`` in a process of its own, as a user runs it), and
puts the floors beside them (:func:`floor_records`): for classification a probe on each
start's frozen mean-pooled states and a bag of words (:mod:`.probe`,
:func:`probe_records`), for tagging the most frequent tag per word, for QA the first
sentence of the context. Each start is reported at the rate with the best mean dev score
over seeds (:func:`best_lr_runs`, the protocol of Devlin et al. 2019, section 4.1), with
the margins over random init and the floor (:func:`summarize`, :func:`print_table`).

Records (one dict per run): ``task``, ``budget`` (train rows, None = all), ``seed``,
``start``, ``kind`` ("finetune" | "probe" | "bow" | "floor"), ``metric`` (the task's:
"accuracy", entity "f1" for NER, SQuAD "f1" for QA; a record without one is "accuracy")
and its test value under that name (in [0, 1]; QA also ``exact_match``); a fine-tuning
record also ``lr`` and ``dev_METRIC``.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from .. import backend, derived, fast
from ..backend import get_device, xp_for
from ..cli import fail, fast_paths_line, job_main, note_args
from ..finetuning.data import DatasetError
from ..modeling import BertModel
from ..provenance import start_fingerprint
from ..runs import RunError, check_inputs, load_start, prepare_run_dir
from ..tokenization import BertTokenizer
from ..viz import plot_accuracy_vs_labels
from .config import CHINESE, ENGLISH, FINETUNE_SCRIPT, EvaluationConfig
from .downstream import load_task
from .probe import bag_of_words, fit_probe, mean_pooled_features

BOW = "bag of words"
SETTINGS = "settings.json"
RESULTS = "results.json"


def open_output(path, settings: dict, overwrite: bool) -> Path:
    """The harness's output directory (:func:`minibert.runs.prepare_run_dir`, job
    "evaluate": owned by this process from here on), with its ``settings.json`` (and its
    size and SHA-256 record beside it, :mod:`minibert.derived`). Finished runs there are
    reused when the settings match but for ``lr`` (each rate has run directories of its
    own), each after its own check (:func:`reused_summary`); with other settings, or a
    damaged ``settings.json``, ``overwrite`` discards them. ``settings["starts"]`` and
    ``settings["task_dirs"]`` are the job's inputs: none may be in the directory
    (:func:`minibert.runs.check_inputs`).

    ``settings.json`` is what ties the finished runs to their settings, so a damaged one
    (its record disagrees, or one written before records that cannot be read) is not
    guessed around: without ``overwrite`` the job ends.

    Raises:
        RunError: an input is there, another job owns it or has its run there, or a
            harness run with other settings is there and ``overwrite`` is not set (with
            it, the old runs are deleted first). DerivedFileError: ``settings.json`` is
            damaged and ``overwrite`` is not set (the message names it and what to
            delete).
    """
    path = Path(path)
    check_inputs(path, {"START": [s.removeprefix("random:") for s in settings.get("starts", ())],
                        "--task-dir": list(settings.get("task_dirs", {}).values())})
    run = prepare_run_dir(path, "evaluate")
    saved_file = path / SETTINGS
    same = True
    if (saved_file.exists() or derived.record_path(saved_file).exists()
            or (path / "runs").exists()):
        problem, saved = derived.check_recorded(saved_file), None
        if problem in (None, "has no record"):   # no record: written before records
            try:
                saved = json.loads(saved_file.read_text(encoding="utf-8"))
            except (OSError, ValueError, UnicodeDecodeError):
                pass
            problem = (None if isinstance(saved, dict) else "cannot be read"
                       if saved_file.exists() else "is missing")
        if problem and not overwrite:
            raise derived.DerivedFileError(
                f"{saved_file} {problem}: the finished runs under {path / 'runs'} cannot "
                f"be matched to their settings; delete {saved_file} and {path / 'runs'} "
                "(or pass --overwrite, which does)")
        same = not problem and {**saved, "lr": None} == {**settings, "lr": None}
    if not same and not overwrite:
        raise RunError(f"--output-dir {path} holds a harness run with other settings "
                       f"({saved_file}); pass --overwrite or another --output-dir")
    if not same:
        shutil.rmtree(path / "runs", ignore_errors=True)
        derived.discard(path / RESULTS)
    derived.write_with_record(run.path / SETTINGS, json_bytes(settings))
    return run.path


def json_bytes(obj) -> bytes:
    """``obj`` as :func:`minibert.atomic.atomic_write_json` writes it."""
    return json.dumps(obj, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"


def is_chinese_vocab(vocab_file: Path) -> bool:
    """True when most of the vocab's tokens are single CJK characters (bert-base-chinese)."""
    tokens = Path(vocab_file).read_text(encoding="utf-8").split("\n")
    cjk = sum(1 for t in tokens if len(t) == 1 and "\u4e00" <= t <= "\u9fff")
    return cjk > 0.5 * len(tokens)


def start_key(start: str, pre) -> str:
    """What the fine-tuning runs of a start are reused by: the content of the start
    (:func:`minibert.provenance.start_fingerprint`), not its path, so a start replaced at
    the same path runs again; ``random:`` starts are kept apart from the trained ones."""
    return ("random:" if start.startswith("random:") else "") + start_fingerprint(pre)


def name_of(key: str, lr: float) -> str:
    """The run directory name of a start (its :func:`start_key`) fine-tuned at a learning
    rate."""
    return f"{hashlib.sha1(key.encode()).hexdigest()[:10]}-lr{lr:g}"


def reused_summary(summary: Path) -> dict | None:
    """The finished fine-tuning run's ``summary.json`` when it can be reused, else None.

    Reused: a summary that matches the size and SHA-256 the harness recorded beside it
    (``summary.json.record.json``, :mod:`minibert.derived`) when the run ended; one written
    before records, that reads as a JSON object (its record is then written). Not reused
    (None, the run is done again): no summary, a summary that differs from its record
    (damaged bytes, truncated, empty) or does not read, a damaged record; a ``note:``
    line on stderr says which file was damaged.
    """
    if not summary.exists() and not derived.record_path(summary).exists():
        return None
    problem = derived.check_recorded(summary)
    if problem in (None, "has no record"):
        try:
            loaded = json.loads(summary.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            loaded = None
        if isinstance(loaded, dict):
            if problem:   # a finished run of a harness without records: adopt it
                derived.write_record(summary)
            return loaded
        problem = "cannot be read" if summary.exists() else "is missing"
    print(f"note: {summary} {problem}; running that fine-tuning again", file=sys.stderr,
          flush=True)
    return None


def run_finetune(script: Path, argv: list[str], out: Path) -> dict:
    """The ``summary.json`` of one ``finetune.py`` run (dev and test metrics at its best
    dev epoch): the script run with ``argv`` and ``--output-dir out`` in a process of its
    own, its output in ``out.log`` beside ``out``; a finished run whose summary.json passes
    its check (:func:`reused_summary`) is reused, a damaged one is run again. The summary's
    size and SHA-256 are recorded beside it when the run ends.

    Raises:
        RuntimeError: the run failed (the message names its command and log).
    """
    summary = out / "summary.json"
    if (found := reused_summary(summary)) is not None:
        return found
    derived.discard(summary)
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"
    command = [sys.executable, str(script), *argv, "--output-dir", str(out), "--overwrite"]
    with open(log, "wb") as f:
        code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"finetune.py {' '.join(argv)} failed (exit {code}); its log: "
                           f"{log}")
    derived.write_record(summary)
    return json.loads(summary.read_text(encoding="utf-8"))


def encoder(pre, random_init: bool, device: str):
    """The frozen encoder of a start (fresh weights for ``random:``) and its tokenizer.

    Raises:
        HFFormatError: weights that do not fit the start's config.
    """
    model, _ = pre.build(BertModel, random_init=random_init, add_pooling_layer=False, seed=0)
    model.to(device)
    return model, BertTokenizer(pre.vocab_file, **pre.tokenizer_options)


def probe_records(features: dict, y: dict, idx: np.ndarray, texts: dict, n_labels: int,
                  **where) -> list[dict]:
    """One seed's probe records: a probe per start on its frozen features (``features``:
    start -> split -> (N, C) host array) and the bag-of-words floor, each fitted on the
    drawn train rows ``idx``, its L2 weight picked on dev, scored on test. ``y``: split ->
    (N,) class ids; ``texts``: split -> list of texts (a pair joined by a space); ``where``:
    task, budget and seed, copied into every record."""
    records = []
    for start, f in features.items():
        probe, _ = fit_probe(f["train"][idx], y["train"][idx], f["dev"], y["dev"], n_labels)
        records.append({**where, "start": start, "kind": "probe", "metric": "accuracy",
                        "accuracy": float((probe.predict(f["test"]) == y["test"]).mean())})
    X, vocab = bag_of_words([texts["train"][i] for i in idx])
    Xd, _ = bag_of_words(texts["dev"], vocab)
    Xt, _ = bag_of_words(texts["test"], vocab)
    probe, _ = fit_probe(X, y["train"][idx], Xd, y["dev"], n_labels,
                         l2_grid=(1e-3, 1e-2, 1e-1, 1.0))
    records.append({**where, "start": BOW, "kind": "bow", "metric": "accuracy",
                    "accuracy": float((probe.predict(Xt) == y["test"]).mean())})
    return records


def finetune_argv(cfg, data, start: str, seed: int, lr: float, train: Path) -> list:
    """finetune.py's options for one run of ``start`` (``random:`` = fresh weights) on the
    task ``data`` (a :mod:`.downstream` task) with the drawn ``train`` file."""
    return ["--task", data.name, "--init", start.removeprefix("random:"), "--train", str(train),
            "--dev", str(data.dev), "--test", str(data.test),
            "--seed", str(seed), "--epochs", str(cfg.epochs), "--lr", str(lr),
            "--batch-size", str(cfg.batch_size), "--max-seq-length", str(cfg.max_seq_length),
            *data.argv(cfg), "--no-progress",
            *(["--random-init"] if start.startswith("random:") else []),
            *(["--device", cfg.device] if cfg.device else []),
            *([] if cfg.fast_cpu else ["--no-fast-cpu"])]


def encode_features(cfg, task: str, data, starts: dict) -> dict:
    """The probes' inputs of a classification task: per start, per split, its frozen
    mean-pooled states ({} without ``cfg.probe`` or for another kind of task)."""
    if not cfg.probe or data.floor is not None:      # a task with a floor of its own
        return {}
    features = {}
    for s, pre in starts.items():
        print(f"{task}: encoding with {s} (frozen, mean-pooled)", flush=True)
        model, tokenizer = encoder(pre, s.startswith("random:"), get_device())
        features[s] = {k: mean_pooled_features(model, tokenizer, ts, cfg.max_seq_length,
                                               xp=xp_for()) for k, ts in data.texts.items()}
    return features


def floor_records(data, features: dict, idx: np.ndarray, where: dict) -> list[dict]:
    """One seed's records beside the fine-tuning runs: for classification the probes and
    the bag of words (:func:`probe_records`), else the task's floor (kind "floor")."""
    if data.floor is not None:
        return [{**where, "start": data.floor, "kind": "floor", "metric": data.metric,
                 **data.floor_scores(idx)}]
    flat = {s: [t if isinstance(t, str) else " ".join(t) for t in ts]
            for s, ts in data.texts.items()}
    return probe_records(features, data.label_ids, idx, flat, len(data.labels), **where)


def evaluate_task(cfg, task: str, d: Path, starts: dict, out: Path, script: Path):
    """Every run of one task (its splits in ``d``, of any kind :func:`.downstream.load_task`
    tells): per budget and seed, each start (name -> :class:`~minibert.runs.Pretrained`)
    fine-tuned by ``script`` (finetune.py) at each rate, and the floors beside them (probes
    and bag of words, or the task's floor); run directories under ``out/runs``, named by
    the start's content (:func:`start_key`), so a finished run is reused only for the same
    start. ``cfg``: evaluate.py's options (:class:`~.config.EvaluationConfig`).

    Returns:
        (the records, as the module docstring says; the rows of the train split).
    Raises:
        DatasetError: a split that cannot be read. RuntimeError: a failed fine-tuning run.
    """
    data = load_task(d)
    data.prepare(out / "runs" / task)
    keys = {s: start_key(s, pre) for s, pre in starts.items()}
    features = encode_features(cfg, task, data, starts)
    records = []
    n = len(data.train)   # a budget of the whole split or more runs once, as "all"
    for b in dict.fromkeys(None if b is not None and b >= n else b for b in cfg.budgets):
        for seed in range(cfg.seeds):
            idx = data.draw(b, seed)
            tag = f"{task}/{'all' if b is None else b}/seed{seed}"
            subset = data.write_train(out / "runs" / tag / f"train.{data.ext}", idx)
            where = {"task": task, "budget": b, "seed": seed}
            for s in starts:
                for lr in cfg.lr if cfg.finetune else ():
                    summary = run_finetune(script, finetune_argv(cfg, data, s, seed, lr, subset),
                                           out / "runs" / tag / name_of(keys[s], lr))
                    dev = data.scores(summary, "dev")[data.metric]
                    records.append({**where, "start": s, "kind": "finetune", "lr": lr,
                                    "metric": data.metric, **data.scores(summary, "test"),
                                    "dev_" + data.metric: dev})
            records += floor_records(data, features, idx, where)
            print(f"{tag}: " + ", ".join(f"{r['start'][-30:]} {r['kind']}"
                                         + (f" lr {r['lr']:g}" if "lr" in r else "")
                                         + f" {score(r):.3f}" for r in records
                                         if r["budget"] == b and r["seed"] == seed), flush=True)
    return records, len(data.train)


def score(record: dict) -> float:
    """A record's test score: the value of its ``metric``."""
    return record[record["metric"]]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def best_lr_runs(records: list[dict]) -> list[dict]:
    """The records without the fine-tuning runs of every learning rate but the one with the
    best mean dev score (the record's ``metric``) over seeds, per (task, budget, start); a
    tie goes to the rate given first. Probe and floor records pass through."""
    dev: dict[tuple, dict[float, list[float]]] = {}
    for r in records:
        if r["kind"] == "finetune":
            key = (r["task"], r["budget"], r["start"])
            dev.setdefault(key, {}).setdefault(r["lr"], []).append(
                r["dev_" + r["metric"]])
    best = {key: max(by_lr, key=lambda lr: statistics.fmean(by_lr[lr]))
            for key, by_lr in dev.items()}
    return [r for r in records if r["kind"] != "finetune"
            or r["lr"] == best[(r["task"], r["budget"], r["start"])]]


def summarize(records: list[dict]) -> list[dict]:
    """Mean and std of the test score (each record's ``metric``) per (task, budget, start,
    kind), with margins over ``random:START``, the bag of words and the task's floor
    (``margin_over_floor``); the fine-tuning rows at each start's best learning rate
    (:func:`best_lr_runs`)."""
    groups: dict[tuple, list[dict]] = {}
    for r in best_lr_runs(records):
        groups.setdefault((r["task"], r["budget"], r["start"], r["kind"]), []).append(r)
    accs = {key: [score(r) for r in rs] for key, rs in groups.items()}
    floors = {(t, b): v for (t, b, _, kind), v in accs.items() if kind == "floor"}
    rows = []
    for (task, b, start, kind), rs in groups.items():
        m, s = mean_std(accs[task, b, start, kind])
        row = {"task": task, "budget": b, "start": start, "kind": kind,
               "metric": rs[0]["metric"], "mean": m, "std": s,
               "seeds": len(rs)}
        if "lr" in rs[0]:  # one rate per fine-tuning group, after best_lr_runs
            row["lr"] = rs[0]["lr"]
        rand = accs.get((task, b, "random:" + start, kind))
        if rand:
            row["margin_over_random"] = m - statistics.fmean(rand)
            row["random_std"] = mean_std(rand)[1]
        bow = accs.get((task, b, BOW, "bow"))
        if bow and kind != "bow":
            row["margin_over_bow"] = m - statistics.fmean(bow)
        if (task, b) in floors and kind != "floor":
            row["margin_over_floor"] = m - statistics.fmean(floors[task, b])
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    """The summary rows as a table on stdout (scores in percent; ``vs floor``: the margin
    over the bag of words, or over the task's floor)."""
    print(f"{'task':<18}{'labels':>7}  {'start':<44}{'kind':<10}{'lr':>8}{'metric':>10}"
          f"{'test':>14}{'vs random':>11}{'vs floor':>10}")
    for r in sorted(rows, key=lambda r: (r["task"], r["budget"] or 10 ** 9,
                                         r["kind"] in ("bow", "floor"), r["start"], r["kind"])):
        b = "all" if r["budget"] is None else r["budget"]
        vr = f"{100 * r['margin_over_random']:+.1f}" if "margin_over_random" in r else ""
        over = r.get("margin_over_bow", r.get("margin_over_floor"))
        vb = f"{100 * over:+.1f}" if over is not None else ""
        lr = f"{r['lr']:g}" if "lr" in r else ""
        print(f"{r['task']:<18}{b:>7}  {r['start'][-44:]:<44}{r['kind']:<10}{lr:>8}"
              f"{r['metric']:>10}{100 * r['mean']:>7.1f} ± "
              f"{100 * r['std']:<4.1f}{vr:>11}{vb:>10}")


SETTINGS_KEYS = ("starts", "tasks", "budgets", "seeds", "epochs", "lr", "batch_size",
                 "max_seq_length", "pooling")


@job_main("evaluate.py")  # a fault ends in one line; the output directory is let go
def run_evaluation(cfg: EvaluationConfig, script: Path = FINETUNE_SCRIPT,
                   prog: str = "evaluate.py") -> dict:
    """Run the harness: what ``evaluate.py`` does with its options, from Python::

        run_evaluation(EvaluationConfig(starts=["runs/pretrain", "random:runs/pretrain"]))

    Args:
        cfg: the options (``tasks`` filled in place when None: the English tasks, or the
            Chinese ones for starts with a Chinese vocab).
        script: the ``finetune.py`` each fine-tuning run executes.
        prog: the name in error lines.
    Returns:
        ``results.json``'s dict: settings, summary rows, every run, train rows per task.
    Raises:
        SystemExit: bad options or input end the job as the script does, with one
            ``PROG: error: ...`` line on stderr (status 2): the ranges and choices of
            :attr:`EvaluationConfig.CHECKS`, :meth:`EvaluationConfig.task_dirs`, starts and
            task files that cannot be read, a failed fine-tuning run.
    """
    cfg.prepare(set(), prog)
    dirs = cfg.task_dirs()
    note_args(cfg.to_dict())
    print(fast_paths_line(cfg.fast_cpu, cfg.device))
    try:
        backend.set_device(cfg.device)
        fast.set_fast_paths(cfg.fast_cpu)
        starts = {s: load_start(s.removeprefix("random:"), "START")
                  for s in dict.fromkeys(cfg.starts)}
        chinese = {is_chinese_vocab(pre.vocab_file) for pre in starts.values()}
        if cfg.tasks is None:
            if len(chinese) > 1:
                fail(prog, "the starts mix Chinese and English vocabularies; name the --tasks")
            cfg.tasks = list(CHINESE if chinese.pop() else ENGLISH)
        settings = {k: getattr(cfg, k) for k in SETTINGS_KEYS}
        settings["task_dirs"] = {t: str(dirs[t]) for t in cfg.tasks}
        out = open_output(cfg.output_dir, settings, cfg.overwrite)
        records, sizes = [], {}
        for task in cfg.tasks:
            runs, sizes[task] = evaluate_task(cfg, task, dirs[task], starts, out, script)
            records += runs
    except (backend.BackendError, DatasetError, ValueError, RuntimeError) as e:
        fail(prog, str(e))  # an OSError ends in job_main's line
    rows = summarize(records)
    print_table(rows)
    results = {"settings": settings, "summary": rows, "runs": records, "train_rows": sizes}
    derived.write_with_record(out / RESULTS, json_bytes(results))
    plot_accuracy_vs_labels(rows, sizes, out / "accuracy_vs_labels.png")
    print(f"wrote {out / RESULTS} and {out / 'accuracy_vs_labels.png'}")
    return results
