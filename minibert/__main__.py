"""Command line: ``python -m minibert COMMAND ...``.

    python -m minibert predict fill-mask runs/pretrain "the man went to the [MASK] ."
    python -m minibert predict feature-extraction MODEL --input texts.txt --pooling mean \\
        --normalize --output embeddings.jsonl
    python -m minibert predict feature-extraction MODEL --pairs --input pairs.tsv
    python -m minibert predict text-classification runs/finetune "a gripping film"
    python -m minibert predict question-answering runs/qa "Who wrote it?" "Ann wrote it."
    python -m minibert score runs/pretrain "the dogs bark ." "the dogs barks ." [--per-token]
    python -m minibert explain runs/finetune "a gripping film" [--target LABEL] \\
        [--method ig|grad-x-input|rollout] --output page.html [--format png]

``predict`` runs a :func:`minibert.pipeline` on the TEXTs or on the lines of ``--input``
and writes one JSON object per input, ``{"input": ..., "output": ...}``, to stdout or
(atomically) to ``--output``. Pairs (a text and its pair for text classification, a
question and its context, two texts to compare with ``--pairs``) are two TEXTs in a row,
or one input line with a tab between them; an input line may also be a JSON object
(``{"text", "text_pair"}``, ``{"question", "context"}``).

``explain`` writes one self-contained HTML page (:mod:`minibert.explain_page`; or a PNG,
``--format png``) of why the model predicts what it does for TEXT: the word pieces and
words coloured by attribution (:mod:`minibert.attribution`), the prediction, and the
attention of each layer and head beside the rollout. A text or token classifier explains
a label, a masked LM the token it puts at the text's [MASK].

``score`` writes the pseudo-log-likelihood of each sentence (:mod:`minibert.scoring`),
``{"text", "score" (nats), "tokens"}`` and with ``--per-token`` ``"token_scores"``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .cli import add_options, fail, int_at_least, job_main
from .scoring import METHODS

PROG = "python -m minibert"
PAIRED = ("question-answering",)


def _parser() -> argparse.ArgumentParser:
    from .pipelines import PIPELINES
    ap = argparse.ArgumentParser(prog=PROG, description="Use a trained minibert model.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("predict", help="run a pipeline (fill-mask, feature-extraction, "
                       "text / token classification, question answering) on texts")
    p.add_argument("task", choices=list(PIPELINES))
    p.add_argument("model", help="a minibert run directory or checkpoint, or a Hugging "
                                 "Face BERT directory")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="inputs (or use --input)")
    p.add_argument("--input", type=Path, help="a UTF-8 file, one input per line")
    p.add_argument("--output", type=Path, help="write the JSON lines here (default stdout)")
    p.add_argument("--batch-size", type=int_at_least(1), default=32)
    p.add_argument("--max-length", type=int_at_least(3),
                   help="tokens per input (default: the model's maximum)")
    p.add_argument("--top-k", type=int_at_least(1),
                   help="fill-mask: tokens per mask (5); text-classification: labels (1)")
    p.add_argument("--pooling", choices=("mean", "cls"),
                   help="feature-extraction: one sentence vector (default: token states)")
    p.add_argument("--normalize", action="store_true",
                   help="feature-extraction: L2-normalise the pooled vector")
    p.add_argument("--pairs", action="store_true",
                   help="feature-extraction: the cosine similarity of two texts per input "
                        "(pooling mean unless --pooling)")
    p.add_argument("--aggregation-strategy", choices=("none", "simple"),
                   help="token-classification: per word (none) or merged entities (simple)")
    add_options(p, device=None, progress=True, fast_cpu=True)

    sc = sub.add_parser("score", help="pseudo-log-likelihood of sentences under a masked LM")
    sc.add_argument("model", help="a pretraining run or checkpoint, or a Hugging Face BERT "
                                  "directory with its MLM head")
    sc.add_argument("texts", nargs="*", metavar="TEXT", help="sentences (or use --input)")
    sc.add_argument("--input", type=Path, help="a UTF-8 file, one sentence per line")
    sc.add_argument("--output", type=Path, help="write the JSON lines here (default stdout)")
    sc.add_argument("--method", choices=METHODS, default="pll-word-l2r",
                    help="pll-word-l2r (Kauf & Ivanova 2023, default) or pll (Salazar et "
                         "al. 2020)")
    sc.add_argument("--per-token", action="store_true", help="also each piece's log p")
    sc.add_argument("--batch-size", type=int_at_least(1), default=64,
                    help="masked copies per forward")
    add_options(sc, device=None, progress=True, fast_cpu=True)

    _explain_parser(sub)
    mp = sub.add_parser("minimal-pairs", help="accuracy on BLiMP-format minimal pairs, "
                        "beside random-weights, word-unigram and word-trigram floors")
    mp.add_argument("paths", nargs="+", metavar="MODEL_OR_PAIRS",
                    help="models (run directories, checkpoints, Hugging Face directories) "
                         "and BLiMP-format .jsonl pair files, in any order")
    mp.add_argument("--blimp", action="store_true",
                    help="also score BLiMP's development pairs (pairIDs 100-299 of its 67 "
                         "paradigms, data/minimal_pairs/blimp/dev.jsonl)")
    mp.add_argument("--method", choices=METHODS, default="pll-word-l2r")
    mp.add_argument("--output", type=Path, help="write the results as JSON here")
    mp.add_argument("--plot", type=Path, help="write the bar chart per field here (PNG)")
    mp.add_argument("--corpus", nargs="+", help="the unigram and trigram floors' text "
                    "(default: the first model's pretraining corpus, as its run recorded it)")
    mp.add_argument("--no-floors", dest="floors", action="store_false",
                    help="score the models only")
    mp.add_argument("--batch-size", type=int_at_least(1), default=128,
                    help="masked copies per forward")
    add_options(mp, device=None, fast_cpu=True)
    return ap


def _explain_parser(sub) -> None:
    """The ``explain`` command's options, each range-checked here."""
    from .attribution import METHODS, STEP_RULES
    ex = sub.add_parser("explain", help="a self-contained HTML page (or PNG) of which words "
                        "carried a prediction, with the attention and its rollout")
    ex.add_argument("model", help="a fine-tuned text / token classifier, or a masked LM "
                                  "(a run directory, checkpoint or Hugging Face directory)")
    ex.add_argument("text", metavar="TEXT", help="the text to explain (a masked LM's with "
                                                 "a [MASK])")
    ex.add_argument("--output", type=Path, required=True, help="the page (or PNG) to write")
    ex.add_argument("--format", choices=("html", "png"), default="html")
    ex.add_argument("--method", choices=METHODS, default="ig",
                    help="ig: integrated gradients (default); grad-x-input; rollout")
    ex.add_argument("--target", help="the label (a masked LM: the token) to explain "
                                     "(default: the prediction)")
    ex.add_argument("--position", type=int_at_least(1),
                    help="token classification: the word piece to explain (default 1)")
    ex.add_argument("--steps", type=int_at_least(2), default=64,
                    help="integrated gradients: points on the path (default 64)")
    ex.add_argument("--step-rule", choices=STEP_RULES, default="gausslegendre")
    ex.add_argument("--baseline", choices=("pad", "mask"), default="pad",
                    help="integrated gradients: the baseline token (default pad)")
    ex.add_argument("--batch-size", type=int_at_least(1), default=16,
                    help="integrated gradients: path points per forward")
    ex.add_argument("--max-length", type=int_at_least(3),
                    help="tokens kept (default: the model's maximum)")
    add_options(ex, device=None, fast_cpu=True)


def explain(args) -> None:
    """``explain``: load the model for its head, explain TEXT, write the page or PNG."""
    from .explain_page import write_page
    from .pipelines import PIPELINES, explain_task, load_pipeline_model
    from .runs import load_start
    _set_device(args)
    pre = load_start(args.model, "MODEL")
    task = explain_task(pre)
    model, tokenizer, extra = load_pipeline_model(task, pre, "MODEL")
    pipe = PIPELINES[task](model, tokenizer, max_length=args.max_length, **extra)
    e = pipe.explain(args.text, method=args.method, target=args.target,
                     position=args.position, steps=args.steps,
                     step_rule_name=args.step_rule, baseline=args.baseline,
                     batch_size=args.batch_size)
    if args.format == "png":
        from .viz import plot_explanation
        plot_explanation(e, args.output)
    else:
        write_page(e, args.output)
    gap = "" if e.gap is None else f", completeness gap {e.gap:+.2g}"
    print(f"{e.predicted} ({e.predicted_probability:.3f}); explained {e.target_label} by "
          f"{e.method}{gap}; wrote {args.output}", file=sys.stderr)


def _inputs(args) -> list:
    """The raw inputs: TEXTs, or the --input file's non-blank lines (JSON objects kept)."""
    from .finetuning.data import DatasetError, text_lines
    if args.input is None:
        if not args.texts:
            raise ValueError("give TEXT arguments or --input FILE")
        return list(args.texts)
    if args.texts:
        raise ValueError("give TEXT arguments or --input FILE, not both")
    items = []
    try:
        for lineno, line in text_lines(args.input):
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{args.input}:{lineno}: not a JSON object ({e.msg})")
            else:
                items.append(line)
    except (DatasetError, OSError) as e:
        raise ValueError(str(e)) from None
    if not items:
        raise ValueError(f"--input {args.input}: no inputs (the file is empty)")
    return items


def _paired(items: list, names: tuple[str, str], what: str) -> list:
    """Inputs that come in pairs: dicts as given, tab-separated lines split, plain TEXTs
    taken two at a time."""
    if all(isinstance(x, dict) for x in items):
        return items
    if all(isinstance(x, str) and "\t" in x for x in items):
        return [dict(zip(names, x.split("\t", 1))) for x in items]
    if len(items) % 2 or any(not isinstance(x, str) for x in items):
        raise ValueError(f"{what} takes pairs: {names[0].upper()} {names[1].upper()} "
                         "arguments, or lines with a tab between the two")
    return [dict(zip(names, items[i:i + 2])) for i in range(0, len(items), 2)]


def _shape(args, items: list) -> list:
    """The inputs as the task takes them: pairs joined into dicts where it takes pairs."""
    if args.pairs:
        return _paired(items, ("text", "text_pair"), "--pairs")
    if args.task == "question-answering":
        return _paired(items, ("question", "context"), args.task)
    if args.task == "text-classification":
        return [_paired([x], ("text", "text_pair"), args.task)[0]
                if isinstance(x, str) and "\t" in x else x for x in items]
    return items


def _run(args, pipe, items: list) -> list:
    """(input, output) per input, in batches of 256 inputs under a progress bar."""
    from tqdm import tqdm
    from .pipelines import cosine_similarity
    options = {k: v for k, v in (("top_k", args.top_k), ("pooling", args.pooling),
                                 ("normalize", args.normalize or None),
                                 ("aggregation_strategy", args.aggregation_strategy))
               if v is not None and k in pipe.options}
    if args.pairs:
        options.setdefault("pooling", "mean")
    out = []
    step = 256
    with tqdm(total=len(items), disable=not (args.progress and args.input), unit="input",
              file=sys.stderr) as bar:
        for i in range(0, len(items), step):
            chunk = items[i:i + step]
            if args.pairs:
                vecs = pipe([x["text"] for x in chunk] + [x["text_pair"] for x in chunk],
                            **options)
                res = [{"cosine": cosine_similarity(vecs[j], vecs[len(chunk) + j])}
                       for j in range(len(chunk))]
            else:
                res = pipe(chunk, **options)
            out += zip(chunk, res)
            bar.update(len(chunk))
    return out


def _set_device(args) -> None:
    """The device (``--device``) and the fast paths (``--fast-cpu``), named on stderr."""
    from .backend import BackendError, set_device
    from .cli import fast_paths_line
    from .fast import set_fast_paths
    try:
        set_device(args.device)
    except BackendError as e:
        raise ValueError(f"--device: {e}") from None
    set_fast_paths(args.fast_cpu)
    print(fast_paths_line(args.fast_cpu, args.device), file=sys.stderr)


def _claim_outputs(args, *options: str) -> None:
    """Before any work: the files of ``options`` (``output``, ``plot``) are none of the
    command's inputs, and their directories are this job's alone (the lock every job
    takes, :func:`minibert.runs.lock_run_dir`). Raises RunError otherwise."""
    from .runs import check_inputs, lock_run_dir
    inputs = {"--input": [args.input] if getattr(args, "input", None) else [],
              "MODEL": [getattr(args, "model", None)] if getattr(args, "model", None) else [],
              "paths": list(getattr(args, "paths", []) or [])}
    for opt in options:
        path = getattr(args, opt, None)
        if path is not None:
            check_inputs(path, {k: v for k, v in inputs.items() if v}, f"--{opt}")
            lock_run_dir(Path(path).resolve().parent, f"the directory of --{opt}")


def _write(args, records: list) -> None:
    """JSON lines to stdout, or atomically to ``--output`` (a failed write ends in
    :func:`minibert.cli.job_main`'s one line)."""
    from .atomic import atomic_write_bytes
    text = "".join(json.dumps(r, ensure_ascii=False, default=np.ndarray.tolist) + "\n"
                   for r in records)
    if args.output is None:
        sys.stdout.write(text)
        return
    atomic_write_bytes(args.output, text.encode("utf-8"))
    print(f"wrote {len(records)} results to {args.output}", file=sys.stderr)


def predict(args) -> None:
    """``predict``: load, run, write (see the module docstring)."""
    from .pipelines import pipeline

    if args.pairs and args.task != "feature-extraction":
        raise ValueError("--pairs needs the feature-extraction task")
    items = _shape(args, _inputs(args))
    _set_device(args)
    pipe = pipeline(args.task, args.model, batch_size=args.batch_size,
                    max_length=args.max_length, fast_cpu=args.fast_cpu)
    _write(args, [{"input": x, "output": y} for x, y in _run(args, pipe, items)])


def score(args) -> None:
    """``score``: the PLL of each sentence (:func:`minibert.scoring.score_texts`), in
    chunks of 256 sentences under a progress bar."""
    from tqdm import tqdm
    from .pipelines import load_pipeline_model
    from .scoring import score_texts

    texts = _inputs(args)
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("score takes sentences, one per line (not JSON objects)")
    _set_device(args)
    model, tokenizer, _ = load_pipeline_model("fill-mask", args.model)
    out = []
    with tqdm(total=len(texts), disable=not (args.progress and args.input), unit="sentence",
              file=sys.stderr) as bar:
        for i in range(0, len(texts), 256):
            out += score_texts(model, tokenizer, texts[i:i + 256], args.method,
                               args.batch_size, args.per_token)
            bar.update(len(texts[i:i + 256]))
    _write(args, out)


def _floor_corpus(args, starts) -> tuple[list[str] | None, list[str]]:
    """The floors' text: (--corpus, nothing left out), else the first model's recorded
    pretraining corpus less the documents its run left out (``exclude_documents``), else
    (None, [])."""
    if args.corpus:
        return args.corpus, []
    for pre in starts:
        recorded = pre.trainer.get("args", {})
        if recorded.get("corpus"):
            return list(recorded["corpus"]), list(recorded.get("exclude_documents") or [])
    return None, []


def _floors(args, starts, pairs) -> dict:
    """The random-weights floor (the first model's architecture, seed 0) and the add-0.1
    word-unigram and Kneser-Ney word-trigram floors on the models' corpus; a note on
    stderr when there is no corpus to count."""
    from .evaluation.minimal_pairs import count_floors, score_pairs_lm, score_pairs_mlm
    from .auto import model_class
    from .modeling import BertForPreTraining
    from .pretraining.corpus import CorpusError, iter_documents, resolve_corpus_files
    from .pretraining.exclusion import DocumentExclusion
    from .tokenization import BertTokenizer

    first = starts[0]
    random = model_class(first.config, BertForPreTraining)(first.config,
                                                           seq_relationship_head=False)
    tok = BertTokenizer(first.vocab_file, **first.tokenizer_options)
    out = {"random weights": score_pairs_mlm(random, tok, pairs, args.method,
                                             args.batch_size)}
    corpus, exclude = _floor_corpus(args, starts)
    if corpus is None:
        print("note: no unigram or trigram floor: the models record no pretraining corpus; "
              "give --corpus", file=sys.stderr)
        return out
    try:
        files = resolve_corpus_files(corpus)
        sentences = [s for doc in iter_documents(files, exclude=DocumentExclusion.read(exclude))
                     for s in doc]
    except CorpusError as e:
        raise ValueError(f"--corpus: {e}") from None
    counted = count_floors(sentences)
    out["unigram (add-0.1, own corpus)"] = score_pairs_lm(counted["unigram"], pairs)
    out["trigram (KN, own corpus)"] = score_pairs_lm(counted["trigram"], pairs)
    return out


def minimal_pairs(args) -> None:
    """``minimal-pairs``: score every model and floor on the pairs, print the table,
    write the JSON and the chart when asked."""
    from .atomic import atomic_write_json
    from .evaluation.minimal_pairs import read_pairs, score_pairs_mlm, table
    from .pipelines import load_pipeline_model
    from .runs import load_start

    from .evaluation.blimp import BLIMP_DEV
    pair_files = [p for p in args.paths if p.endswith(".jsonl") and Path(p).is_file()]
    models = [p for p in args.paths if p not in pair_files]
    pair_files += [str(BLIMP_DEV)] if args.blimp else []
    if not pair_files or not models:
        raise ValueError("give at least one model and one .jsonl pairs file (or --blimp)")
    pairs = [p for f in pair_files for p in read_pairs(f)]
    _set_device(args)
    results, starts = {}, []
    for m in models:
        starts.append(load_start(m, "model"))
        model, tok, _ = load_pipeline_model("fill-mask", starts[-1], "model")
        results[m] = score_pairs_mlm(model, tok, pairs, args.method, args.batch_size)
    if args.floors:
        results.update(_floors(args, starts, pairs))
    print(f"{len(pairs)} pairs, {len(results[models[0]]['paradigms'])} paradigms "
          f"({args.method}); accuracy in %, chance 50")
    print(table(results))
    if args.output:
        atomic_write_json(args.output, {"method": args.method, "pairs": len(pairs),
                                        "files": pair_files, "results": results})
        print(f"wrote {args.output}")
    if args.plot:
        from .viz import plot_minimal_pairs
        print(f"wrote {plot_minimal_pairs(results, args.plot)}")


@job_main(PROG)
def main(argv=None) -> int:
    """Run a command; bad input ends in one ``error:`` line and exit status 2, a fault
    (disk full, out of memory, Ctrl-C) in one line too (:func:`minibert.cli.job_main`)."""
    args = _parser().parse_args(argv)
    try:
        _claim_outputs(args, "output", "plot")
        {"predict": predict, "score": score, "explain": explain,
         "minimal-pairs": minimal_pairs}[args.command](args)
    except ValueError as e:            # RunError, PipelineError, DatasetError included
        fail(PROG, str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
