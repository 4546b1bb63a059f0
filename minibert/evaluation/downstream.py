"""The downstream tasks of the evaluation harness (:mod:`.harness`), one class per kind of
``finetune.py --task``: how a task directory is read, how the train rows of one run are
drawn and written for ``finetune.py``, which metric the run reports, and the task's floor.
Each is the data side of a task (``...Data``); the model side, what ``finetune.py`` trains,
is :mod:`minibert.finetuning.tasks`.

* :class:`ClassificationData` (``train.tsv`` with a ``label`` header): accuracy; floor: the
  bag of words (fitted by the harness with the probes, :func:`.harness.probe_records`).
* :class:`TaggingData` (``train.tsv`` of ``word<TAB>tag`` lines): token accuracy, or entity F1
  when the tags are entity tags (O, B-X, I-X ...); budgets count sentences; floor: each
  word's most frequent train tag, the overall most frequent tag for an unseen word
  (:class:`~minibert.finetuning.MostFrequentTagBaseline`).
* :class:`QuestionAnsweringData` (``train.jsonl``): SQuAD F1 (exact match beside it);
  budgets count questions; floor: the context's first sentence as the answer. Without a
  ``test.jsonl`` the task's ``dev.jsonl`` is the test split and the last fifth of the
  train articles (whole articles, at least one) is the dev split that picks the epoch and
  the rate, so no rate is chosen on the questions it is scored on.

Every score is in [0, 1] (SQuAD's percentages divided by 100); the metrics are
``finetune.py``'s (:mod:`minibert.finetuning`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_bytes
from ..finetuning import (MostFrequentTagBaseline, read_conll, read_squad,
                          read_tsv, sort_tags, squad_metrics)
from ..finetuning.data import text_lines, tsv_header
from ..finetuning.tasks import TASKS

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")


def draw(n_rows: int, size: int | None, seed: int, labels: list[str] | None = None
         ) -> np.ndarray:
    """The train rows of one run: all (in order) or ``size`` drawn without replacement;
    with ``labels`` (one per row) re-drawn (up to 100 times) until at least two classes
    are present.

    Returns:
        int array of row indices, sorted. Raises: ValueError when no draw holds two classes.
    """
    if size is None or size >= n_rows:
        return np.arange(n_rows)
    rng = np.random.default_rng([seed, size])
    for _ in range(100):
        idx = np.sort(rng.choice(n_rows, size=size, replace=False))
        if labels is None or len({labels[i] for i in idx}) > 1:
            return idx
    raise ValueError(f"cannot draw {size} train rows holding two classes")


class ClassificationData:
    """Sentence (pair) classification: ``label<TAB>sentence[<TAB>sentence_b]`` TSV files.

    Attributes: ``name`` (finetune.py's --task), ``metric``, ``unit`` (what a budget
    counts), ``floor`` (the floor's start name, None: the harness's bag of words),
    ``splits`` (split -> examples), ``dev`` / ``test`` (the files finetune.py reads),
    ``labels`` (the labels of all splits, sorted), and per split ``label_ids`` ((N,) int class
    ids) and ``texts`` (a text, or a pair as a tuple), the probes' inputs.
    """

    name, metric, unit, floor = "sequence-classification", "accuracy", "rows", None

    def __init__(self, d: Path):
        self.splits = {s: read_tsv(d / f"{s}.tsv") for s in ("train", "dev", "test")}
        self.dev, self.test = d / "dev.tsv", d / "test.tsv"
        self.labels = sorted({e.label for ex in self.splits.values() for e in ex})
        ids = {label: i for i, label in enumerate(self.labels)}
        # what the probes and the bag of words read, per split: class ids and texts
        self.label_ids = {s: np.array([ids[e.label] for e in ex])
                          for s, ex in self.splits.items()}
        self.texts = {s: [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in ex]
                      for s, ex in self.splits.items()}

    @property
    def train(self) -> list:
        return self.splits["train"]

    @property
    def ext(self) -> str:
        """The extension of the task's files, as finetune.py's task reads them."""
        return TASKS[self.name].ext

    def draw(self, size: int | None, seed: int) -> np.ndarray:
        """Train rows of one run (:func:`draw`, two classes at least)."""
        return draw(len(self.train), size, seed, [e.label for e in self.train])

    def prepare(self, directory: Path) -> None:
        """Write what every run of the task shares into ``directory`` (nothing here)."""

    def write_train(self, path: Path, idx: np.ndarray) -> Path:
        """The drawn rows as a train.tsv that finetune.py reads (atomically)."""
        examples = self.train
        pair = examples[0].text_b is not None
        header = "label\tsentence_a\tsentence_b" if pair else "label\tsentence"
        rows = [f"{e.label}\t{e.text_a}" + (f"\t{e.text_b}" if pair else "")
                for e in (examples[i] for i in idx)]
        atomic_write_bytes(path, ("\n".join([header, *rows]) + "\n").encode("utf-8"))
        return path

    def argv(self, cfg) -> list[str]:
        """finetune.py options of this kind beyond the task, splits, sequence length, seed,
        rate and start (:func:`.harness.finetune_argv`)."""
        return ["--pooling", cfg.pooling, "--group-by-length"]

    def scores(self, summary: dict, split: str) -> dict[str, float]:
        """{metric: value in [0, 1]} of a finetune.py summary's ``split`` ("dev"/"test")."""
        return {self.metric: float(summary[split][self.metric])}


class TaggingData(ClassificationData):
    """Token classification: ``word<TAB>tag`` files, a blank line between sentences.
    Every run gets the tag set of all three splits (``--labels``, written once by
    :meth:`write_labels`), so class ids are the same at every budget and seed."""

    name, unit, floor = "token-classification", "sentences", "most frequent tag"

    def __init__(self, d: Path):
        self.splits = {s: read_conll(d / f"{s}.tsv") for s in ("train", "dev", "test")}
        self.dev, self.test = d / "dev.tsv", d / "test.tsv"
        self.tags = sort_tags(t for ss in self.splits.values() for s in ss for t in s.tags)
        self.metric = TASKS[self.name]().default_metric(self.tags)
        self.labels_file: Path | None = None

    def draw(self, size: int | None, seed: int) -> np.ndarray:
        return draw(len(self.train), size, seed)

    def prepare(self, directory: Path) -> None:
        """``directory/labels.txt``: the tag set, for finetune.py's ``--labels``."""
        self.labels_file = Path(directory) / "labels.txt"
        atomic_write_bytes(self.labels_file, ("\n".join(self.tags) + "\n").encode("utf-8"))

    def write_train(self, path: Path, idx: np.ndarray) -> Path:
        """The drawn sentences as a CoNLL train.tsv (atomically)."""
        text = "".join("".join(f"{w}\t{t}\n" for w, t in zip(s.words, s.tags)) + "\n"
                       for s in (self.train[i] for i in idx))
        atomic_write_bytes(path, text.encode("utf-8"))
        return path

    def argv(self, cfg) -> list[str]:
        return ["--labels", str(self.labels_file)]

    def floor_scores(self, idx: np.ndarray) -> dict[str, float]:
        """The most-frequent-tag floor fitted on the drawn train sentences, on test."""
        base = MostFrequentTagBaseline().fit([self.train[i] for i in idx])
        return {self.metric: float(base.score(self.splits["test"])[self.metric])}


def first_sentence(context: str) -> str:
    """The first sentence of a context: up to the first ``.``, ``!`` or ``?`` followed by
    whitespace and a capital, digit or opening quote (the whole context when none)."""
    return _SENTENCE_END.split(context.strip(), maxsplit=1)[0]


class QuestionAnsweringData(ClassificationData):
    """Extractive QA, SQuAD v1.1 JSON lines (see the module docstring for the splits)."""

    name, metric, unit, floor = "question-answering", "f1", "questions", "first sentence"

    def __init__(self, d: Path):
        train = read_squad(d / "train.jsonl")
        self.test = d / ("test.jsonl" if (d / "test.jsonl").is_file() else "dev.jsonl")
        self.dev = d / "dev.jsonl" if self.test.name == "test.jsonl" else None
        self.held_out = self.dev is None
        dev = read_squad(self.dev) if self.dev is not None else []
        if self.held_out:
            titles = list(dict.fromkeys(e.title for e in train))
            held = set(titles[len(titles) - max(1, round(len(titles) / 5)):])
            dev = [e for e in train if e.title in held]
            train = [e for e in train if e.title not in held]
        if not train:
            raise ValueError(f"{d}: no train question is left after holding out the dev "
                             "articles; give a dev.jsonl and a test.jsonl")
        self.splits = {"train": train, "dev": dev, "test": read_squad(self.test)}

    def draw(self, size: int | None, seed: int) -> np.ndarray:
        return draw(len(self.train), size, seed)

    @staticmethod
    def _jsonl(examples) -> bytes:
        return "".join(json.dumps({"id": e.id, "title": e.title, "context": e.context,
                                   "question": e.question,
                                   "answers": {"text": e.answers,
                                               "answer_start": e.answer_starts}},
                                  ensure_ascii=False) + "\n" for e in examples).encode("utf-8")

    def prepare(self, directory: Path) -> None:
        """Without a test.jsonl: the held-out dev articles as ``directory/dev.jsonl``."""
        if self.held_out:
            self.dev = Path(directory) / "dev.jsonl"
            atomic_write_bytes(self.dev, self._jsonl(self.splits["dev"]))

    def write_train(self, path: Path, idx: np.ndarray) -> Path:
        """The drawn questions as a train.jsonl (atomically)."""
        atomic_write_bytes(path, self._jsonl(self.train[i] for i in idx))
        return path

    def argv(self, cfg) -> list[str]:
        return ["--doc-stride", str(max(1, cfg.max_seq_length // 4))]

    def scores(self, summary: dict, split: str) -> dict[str, float]:
        return {k: float(summary[split][k]) / 100 for k in TASKS[self.name].metrics}

    def floor_scores(self, idx: np.ndarray) -> dict[str, float]:
        """The first-sentence floor on test (it learns nothing from the train rows)."""
        test = self.splits["test"]
        m = squad_metrics(test, {e.id: first_sentence(e.context) for e in test})
        return {k: m[k] / 100 for k in TASKS[self.name].metrics}


def load_task(d: Path) -> ClassificationData:
    """The task in directory ``d``, its kind told by its files: ``train.jsonl``: question
    answering; ``train.tsv`` whose first line is a classification header
    (:func:`~minibert.finetuning.data.tsv_header`, as :func:`read_tsv` reads it):
    classification; another ``train.tsv``: tagging.

    Raises:
        DatasetError: a split that cannot be read (file and line). ValueError: no
            train question left for QA.
    """
    d = Path(d)
    if (d / "train.jsonl").is_file():
        return QuestionAnsweringData(d)
    if not (d / "train.tsv").is_file():
        return ClassificationData(d)      # read_tsv names the missing file
    first = next(text_lines(d / "train.tsv"), (1, ""))[1]
    return ClassificationData(d) if tsv_header(first) else TaggingData(d)


__all__ = ["draw", "ClassificationData", "TaggingData", "QuestionAnsweringData",
           "first_sentence", "load_task"]
