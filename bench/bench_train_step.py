#!/usr/bin/env python
"""Time one full pretraining step (forward, backward, clip, AdamW) of minibert (the step of
minibert.training, the loop every job runs) and of
transformers' BertForPreTraining on the same config and the same batch, in one run.

    python bench/bench_train_step.py                       # tiny and mini, CPU
    python bench/bench_train_step.py --presets mini --device cuda
    python bench/bench_train_step.py --presets mini small --device cuda --precision fp16
    python bench/bench_train_step.py --presets mini small --device cuda --precision bf16
    python bench/bench_train_step.py --presets mini --device cuda \
        --precision fp32 tf32 fp16 bf16 --systems minibert torch_equal_work torch_graphed

Peers: PyTorch doing minibert's work (transformers' modules, the MLM head only on the
masked rows), the same with its forward and backward replayed as CUDA graphs
(``torch.cuda.make_graphed_callables``, GPU only), transformers' BertForPreTraining as
users run it (the head on every position), and minibert's own ``--cuda-graphs`` step
(``minibert_graphed``, GPU only). All train with dropout on, batch 32 x 128 tokens, 15% of
tokens masked (at most 20 per sequence, as BERT's data), vocab 30522, at one --precision:
float32, TF32 matmuls (GPU), float16 mixed precision (minibert's ``--dtype float16``
against PyTorch's autocast with a GradScaler), or bfloat16 (GPU: ``--dtype bfloat16``
against autocast to bfloat16, neither with loss scaling).

``--isa avx2`` holds every process to what a CPU without AVX-512 runs, on a machine that
has it: OpenBLAS's Haswell kernel (``OPENBLAS_CORETYPE``), NumPy's AVX2 loops (its
AVX-512 dispatch switched off with ``NPY_DISABLE_CPU_FEATURES``), and PyTorch's AVX2
kernels (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``); the
first line printed names the kernels each library then reports.

Each system runs in its own fresh Python process, as its users run it (minibert's
``set_fast_paths(True)``, which the jobs call and so does this benchmark, changes the
process's malloc settings, which would otherwise speed up the peers in the same process too;
see ``minibert.fast_cpu.keep_freed_memory``). The
processes take turns: --rounds rounds of minibert, then each peer of --systems, so
drifts in the machine's speed reach all of them. Each process times --steps steps after
--warmup untimed ones at each --precision in turn (a fresh model for each). Reported: the
median seconds per step over every round's steps, tokens/s (B*T / step time), the ratio
minibert / peer, and the speed table (:func:`speed_table`).

MFU: the model FLOPs of a step (:func:`step_flops`: forward + backward = 3x the forward's
matmul FLOPs, the MLM head on the masked rows only) per second, over the GEMM peak of this
machine measured in the same run: on the CPU the float32 peak (:func:`gemm_peak`: the best
of square 2048-matmuls through the same NumPy/BLAS and thread count), on the GPU the peak at
the run's precision (:func:`cuda_gemm_peak`: square 8192-matmuls through CuPy, in a process
of its own).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np


def make_batch(rng, B, T, V, max_pred=20):
    """Dense HF-style labels (for transformers) and their fixed-shape form (for minibert)."""
    from minibert.modeling import masked_lm_from_labels
    ids = rng.integers(1000, V, size=(B, T))
    labels = np.full((B, T), -100)
    for b in range(B):
        pos = rng.choice(np.arange(1, T - 1), size=min(max_pred, round(0.15 * T)), replace=False)
        labels[b, pos] = ids[b, pos]
    tt = (np.arange(T)[None] >= T // 2).astype(np.int64).repeat(B, 0)
    common = dict(input_ids=ids, token_type_ids=tt, attention_mask=np.ones((B, T), np.int64),
                  next_sentence_label=rng.integers(0, 2, size=B))
    positions, mlm_ids, weights = masked_lm_from_labels(labels, width=max_pred)
    return (dict(common, labels=labels),
            dict(common, masked_lm_positions=positions, masked_lm_ids=mlm_ids,
                 masked_lm_weights=weights))


def step_flops(config, B: int, T: int, P: int) -> float:
    """Matmul FLOPs of one training step (forward and backward, 2 FLOPs per multiply-add;
    backward = 2x forward, as Kaplan et al. 2020 count): per layer the QKV, output and
    feed-forward projections (2 x tokens x (4 C^2 + 2 C I)) and the two attention products
    (2 x 2 x B x T^2 x C); the MLM transform and decoder on the B x P masked rows
    (2 x B P (C^2 + C V)); the pooler and NSP head are left out (< 0.1%)."""
    C, I, L, V = (config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                  config.vocab_size)
    forward = L * (2 * B * T * (4 * C * C + 2 * C * I) + 4 * B * T * T * C) \
        + 2 * B * P * (C * C + C * V)
    return 3.0 * forward


def gemm_peak(n: int = 2048, repeats: int = 5) -> float:
    """The best float32 GFLOP/s of an n x n x n matmul through NumPy (this BLAS, these
    threads): the ceiling minibert's step is measured against."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), np.float32)
    np.matmul(a, b, out=out)
    best = min(_timed(lambda: np.matmul(a, b, out=out)) for _ in range(repeats))
    return 2.0 * n ** 3 / best / 1e9


def cuda_gemm_peak(precision: str = "fp32", n: int = 8192, repeats: int = 5) -> float:
    """The best GFLOP/s of an n x n x n matmul through CuPy on the GPU at ``precision``
    (fp32: float32 with TF32 off; tf32: float32 with TF32 on; fp16 / bf16: float16 /
    bfloat16 operands, float32 accumulation): the ceiling minibert's GPU step is measured
    against.

    Args:
        precision: one of :data:`PRECISIONS`. n: the matrices' side (two n x n operands).
        repeats: timed products; the fastest counts.
    Returns:
        GFLOP/s (2 n^3 FLOPs over the fastest product's seconds, synchronised each time).
    Raises:
        minibert.backend.BackendError: no usable GPU (``set_device("cuda")``)."""
    import cupy
    from minibert import backend
    backend.set_device("cuda")
    if precision == "tf32" or backend.get_tf32():   # off unless asked (backend's default)
        backend.set_tf32(precision == "tf32")
    dtype = DTYPES[precision]()
    rng = np.random.default_rng(0)
    a, b = (cupy.asarray(rng.standard_normal((n, n), dtype=np.float32)).astype(dtype)
            for _ in range(2))
    out = cupy.empty((n, n), dtype)
    sync = cupy.cuda.get_current_stream().synchronize
    cupy.matmul(a, b, out=out)
    sync()
    best = min(_timed(lambda: (cupy.matmul(a, b, out=out), sync())) for _ in range(repeats))
    return 2.0 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class FixedBatchTask:
    """The same pretraining batch every step, through minibert.training's step."""

    evaluate = None

    def __init__(self, inputs):
        self.inputs = inputs

    def forward(self, model, batch):
        out = model(**self.inputs)
        return out.loss, {}


class GraphedTask:
    """The pretraining forward of a PretrainingBatch, its arrays moved to the model's device
    (a no-op for the graph's static buffers, which are there already)."""

    evaluate = None

    def __init__(self, sentence_label: str):
        self.sentence_label = sentence_label

    def forward(self, model, batch):
        from minibert.backend import get_array_module
        xp = get_array_module(model.parameters()[0].data)
        inputs = {k: xp.asarray(v) for k, v in batch.model_inputs().items()}
        inputs[self.sentence_label] = inputs.pop("next_sentence_label")
        return model(**inputs).loss, {}


PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
DTYPES = {"fp32": lambda: np.dtype(np.float32), "tf32": lambda: np.dtype(np.float32),
          "fp16": lambda: np.dtype(np.float16),
          "bf16": lambda: __import__("minibert.backend").backend.resolve_dtype("bfloat16",
                                                                               "cuda")}
"""Each precision's parameter dtype in minibert (bf16 needs ml_dtypes: resolved on use)."""


def minibert_step_fn(config, batch, device, precision="fp32", graphed=False):
    """minibert's step: ``--tf32`` sets TF32 matmuls (GPU), fp16 is ``--dtype float16``
    (float16 compute, float32 master weights in AdamW, dynamic loss scaling), bf16 is
    ``--dtype bfloat16`` (the same without loss scaling). The model is
    the pretraining class of the config's family (an ALBERT config gives
    AlbertForPreTraining, its sentence label under its own keyword); ``step.model`` is it.
    ``graphed``: the step replayed from a CUDA graph (``--cuda-graphs``,
    :class:`minibert.graphs.GraphedStep`; the batch copied into its buffers each step, as
    the job does)."""
    from minibert import backend, fast
    from minibert.auto import model_class
    from minibert.modeling import BertForPreTraining
    from minibert.optim import AdamW
    from minibert.training import TrainingConfig, train_step
    backend.set_device(device)
    fast.set_fast_paths(True)  # what the jobs run
    if precision == "tf32" or backend.get_tf32():   # on for tf32, off again after it
        backend.set_tf32(precision == "tf32")
    xp = backend.xp_for(device)
    dtype = DTYPES[precision]()
    model = model_class(config, BertForPreTraining)(config, dtype=dtype).to(device)
    opt = AdamW(model.named_parameters(), lr=1e-4)
    inputs = {k: xp.asarray(v) for k, v in batch.items()}
    inputs[model.sentence_label] = inputs.pop("next_sentence_label")
    task = FixedBatchTask(inputs)
    cfg = TrainingConfig(max_steps=1, lr=1e-4, max_grad_norm=1.0)
    count = [0]
    run = (lambda micro, s, lr: train_step(model, opt, task, micro, s, lr, cfg, device=device))
    micro = [None]
    if graphed:
        from minibert.distributed import Communicator
        from minibert.graphs import GraphedStep
        from minibert.pretraining import PretrainingBatch
        host = {k: np.asarray(v) for k, v in batch.items()}
        micro = [PretrainingBatch(host["input_ids"], host["token_type_ids"],
                                  host["attention_mask"], host["masked_lm_positions"],
                                  host["masked_lm_ids"],
                                  host["masked_lm_weights"].astype(np.float32),
                                  host["next_sentence_label"])]
        task = GraphedTask(model.sentence_label)
        run = GraphedStep(model, opt, task, cfg, Communicator(), backend.DropoutRNG(device))

    def step():
        loss, *_ = run(micro, count[0], 1e-4)
        count[0] += 1
        return float(loss)  # a host sync, as a training loop that logs the loss has
    step.model = model
    return step


def hf_model(config, dev: str):
    """transformers' BertForPreTraining of minibert's ``config`` on ``dev``, in training
    mode."""
    import transformers
    fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "intermediate_size", "hidden_act", "hidden_dropout_prob",
              "attention_probs_dropout_prob", "max_position_embeddings")
    hf_config = transformers.BertConfig(**{k: getattr(config, k) for k in fields})
    return transformers.BertForPreTraining(hf_config).to(dev).train()


def equal_work_module(model, inputs, autocast):
    """minibert's work as a torch module of (input_ids, attention_mask, token_type_ids)
    -> loss: the MLM head only on the masked rows of ``inputs["labels"]`` (found once:
    the batch is fixed; google-research/bert's gather_indexes), the NSP head on the pooled
    [CLS], the forward inside ``autocast()``."""
    import torch
    labels = inputs["labels"]
    rows = (labels != -100).nonzero(as_tuple=True)

    class EqualWork(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            with autocast():
                enc = model.bert(input_ids, attention_mask=attention_mask,
                                 token_type_ids=token_type_ids)
                logits = model.cls.predictions(enc.last_hidden_state[rows])      # (N, V)
                nsp = model.cls.seq_relationship(enc.pooler_output)               # (B, 2)
                f = torch.nn.functional
                return f.cross_entropy(logits, labels[rows]) + f.cross_entropy(
                    nsp, inputs["next_sentence_label"])
    return EqualWork()


def torch_step_fn(config, batch, device, equal_work=False, precision="fp32",
                  graphed=False):
    """PyTorch eager: tf32 allows TF32 matmuls, fp16 is automatic mixed precision
    (``torch.autocast`` float16 around the forward, ``GradScaler``), bf16 the same to
    bfloat16 without the scaler, as its users run it.

    ``graphed`` (GPU, equal work only): the forward and backward replayed as CUDA graphs by
    ``torch.cuda.make_graphed_callables`` (PyTorch's "CUDA Graphs" notes: autocast inside
    with ``cache_enabled=False``; dropout draws from the graph-safe Philox generator); the
    masked rows are found once, outside the graph, as the batch is fixed. Clipping, the
    GradScaler and AdamW stay eager."""
    import contextlib
    import torch
    dev = "cuda" if device == "cuda" else "cpu"
    model = hf_model(config, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01)
    inputs = {k: torch.from_numpy(v).to(dev) for k, v in batch.items()}
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = \
        precision == "tf32"
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(dev, enabled=precision == "fp16")
    autocast = (lambda: torch.autocast(dev, dtype=half, cache_enabled=not graphed)) \
        if half is not None else contextlib.nullcontext
    args = (inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
    equal = equal_work_module(model, inputs, autocast)
    if graphed:
        equal = torch.cuda.make_graphed_callables(equal, args)

    def step():
        opt.zero_grad(set_to_none=True)
        if equal_work or graphed:
            loss = equal(*args)
        else:
            with autocast():
                loss = model(**inputs).loss
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        return loss.item()
    return step


SYSTEMS = ("minibert", "torch_equal_work", "transformers", "torch_graphed",
           "minibert_graphed")
GPU_ONLY = ("torch_graphed", "minibert_graphed")          # CUDA graphs


# what an AVX2 CPU without AVX-512 runs, for every library of the benchmark
AVX2_ENV = {"OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2",
            "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"}


def held_to_avx2() -> None:
    """Start this script again with :data:`AVX2_ENV` set (the BLAS and NumPy read it when
    they load, so it cannot be set later in the process). NumPy's AVX-512 dispatch is
    switched off only where this NumPy dispatches to it (NumPy refuses to switch off a
    feature it does not know)."""
    import os
    env = dict(os.environ, **AVX2_ENV, MINIBERT_BENCH_ISA="avx2")
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__ as dispatch
    except ImportError:                                  # NumPy 1
        from numpy.core._multiarray_umath import __cpu_dispatch__ as dispatch
    features = [f for f in env["NPY_DISABLE_CPU_FEATURES"].split() if f in dispatch]
    if features:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(features)
    else:
        env.pop("NPY_DISABLE_CPU_FEATURES")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def kernels() -> str:
    """The kernels the libraries of this process run: OpenBLAS's core type (threadpoolctl),
    NumPy's highest dispatched AVX level, PyTorch's CPU capability."""
    from numpy._core._multiarray_umath import __cpu_features__ as features
    from minibert.fast_cpu import openblas_kernels
    blas = openblas_kernels()
    numpy_isa = "AVX-512" if features.get("AVX512_SKX") else \
        "AVX2" if features.get("AVX2") else "below AVX2"
    import torch
    return (f"OpenBLAS {','.join(map(str, blas)) or 'none'}, NumPy {numpy_isa}, "
            f"torch {torch.backends.cpu.get_cpu_capability()}")


def run_child(script: str, system: str, preset: str, **options):
    """Run ``script --one SYSTEM --presets PRESET --OPTION VALUE ...`` in a fresh Python
    process (options named as keywords, ``batch_size`` -> ``--batch-size``; a list gives
    several values) and return the JSON of the last line it prints. Raises
    CalledProcessError when the child fails."""
    argv = [sys.executable, script, "--one", system, "--presets", preset]
    for name, value in options.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        argv += [f"--{name.replace('_', '-')}", *map(str, values)]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def time_steps(system: str, preset: str, args) -> dict[str, list[float]]:
    """Build one system's step for ``preset`` in this process at each of args.precision in
    turn and return {precision: the seconds of each of args.steps steps, after args.warmup
    untimed ones}."""
    from minibert import BertConfig
    config = BertConfig.from_preset(preset, vocab_size=args.vocab_size)
    hf_batch, batch = make_batch(np.random.default_rng(0), args.batch_size, args.seq_len,
                                 args.vocab_size)
    sync = lambda: None  # noqa: E731
    if args.device == "cuda" and system.startswith("minibert"):
        import cupy                 # minibert's process never imports torch's CUDA runtime
        sync = cupy.cuda.get_current_stream().synchronize
    elif args.device == "cuda":
        import torch
        sync = torch.cuda.synchronize
    found = {}
    for precision in args.precision:
        if system.startswith("minibert"):
            fn = minibert_step_fn(config, batch, args.device, precision,
                                  graphed=system == "minibert_graphed")
        else:
            fn = torch_step_fn(config, hf_batch, args.device, system == "torch_equal_work",
                               precision, graphed=system == "torch_graphed")
        for _ in range(args.warmup):
            fn()
        times = []
        for _ in range(args.steps):
            sync()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        found[precision] = times
        del fn
    return found


def speed_table(rows: list[dict]) -> list[str]:
    """The rows as a Markdown table: preset, precision, minibert's ms per step and its ratio
    to each peer that ran (tokens/s over tokens/s), and minibert's speed-up over its own
    fp32 step of the same preset."""
    peers = [s for s in SYSTEMS[1:] if any(f"{s}_s_per_step" in r for r in rows)]
    lines = ["| preset | precision | minibert ms | " + " | ".join(
        f"x {p}" for p in peers) + " | x own fp32 |", "|---|---|---|" + "---|" * (len(peers) + 1)]
    fp32 = {r["preset"]: r["minibert_s_per_step"] for r in rows if r["precision"] == "fp32"}
    for r in rows:
        own = fp32.get(r["preset"])
        gain = f"{own / r['minibert_s_per_step']:.2f}" if own else ""
        lines.append(f"| {r['preset']} | {r['precision']} | {1e3 * r['minibert_s_per_step']:.1f}"
                     " | " + " | ".join(f"{r.get(f'ratio_minibert_over_{p}', float('nan')):.2f}"
                                        for p in peers) + f" | {gain} |")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["tiny", "mini"],
                   help="tiny, mini, small, medium or base")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--steps", type=int, default=5, help="timed steps per process")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per process")
    p.add_argument("--rounds", type=int, default=2,
                   help="processes per system, taking turns with the other systems")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", nargs="+", choices=PRECISIONS, default=["fp32"],
                   help="one or more of: fp32; tf32 (TF32 matmuls, --device cuda only); fp16 "
                        "(minibert's --dtype float16 against PyTorch's autocast + GradScaler); "
                        "bf16 (--dtype bfloat16 against autocast to bfloat16; --device cuda "
                        "only). Each process times them in turn")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=None,
                   help="minibert and the peers to time (default: minibert, torch_equal_work "
                        "and transformers, and with --device cuda torch_graphed (PyTorch's "
                        "equal work with its forward and backward as CUDA graphs) and "
                        "minibert_graphed (minibert's --cuda-graphs step))")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--isa", choices=["native", "avx2"], default="native",
                   help="avx2: hold NumPy, OpenBLAS and PyTorch to AVX2 kernels, as on a CPU "
                        "without AVX-512 (default: what this CPU picks)")
    p.add_argument("--one", choices=SYSTEMS + ("gemm_peak",), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("steps", "warmup", "rounds", "batch_size", "seq_len", "vocab_size"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            p.error(f"--{name.replace('_', '-')} must be >= {0 if name == 'warmup' else 1}, "
                    f"got {getattr(args, name)}")
    if args.device != "cuda" and {"tf32", "bf16"} & set(args.precision):
        p.error("--precision tf32 and bf16 are GPU settings (TF32 tensor cores; minibert's "
                "--dtype bfloat16): use --device cuda")
    systems = args.systems or [s for s in SYSTEMS
                               if s not in GPU_ONLY or args.device == "cuda"]
    if "minibert" not in systems:
        p.error("--systems: minibert is what the peers are compared with; name it too")
    for system in set(GPU_ONLY) & set(systems):
        if args.device != "cuda":
            p.error(f"--systems {system} replays CUDA graphs: use --device cuda")
    if args.isa == "avx2" and args.device != "cpu":
        p.error("--isa avx2 holds the CPU's kernels: use it with --device cpu")
    if args.isa == "avx2" and not args.one and os.environ.get("MINIBERT_BENCH_ISA") != "avx2":
        held_to_avx2()                                   # does not return
    if args.one == "gemm_peak":  # a child process: the GPU's GEMM peak at each precision
        print(json.dumps({q: cuda_gemm_peak(q) for q in args.precision}))
        return 0
    if args.one:  # a child process: one system, one preset, each precision
        print(json.dumps(time_steps(args.one, args.presets[0], args)))
        return 0

    import torch
    print(f"machine: {platform.processor() or platform.machine()}, torch threads "
          f"{torch.get_num_threads()}, torch {torch.__version__}, numpy {np.__version__}, "
          f"device {args.device}")
    if args.device == "cpu":
        print(f"kernels: {kernels()}")
        peak = gemm_peak()
        print(f"float32 GEMM peak (2048^3 matmul, best of 5): {peak:.1f} GFLOP/s")
        peaks = {q: peak for q in args.precision}
    else:
        peaks = run_child(__file__, "gemm_peak", args.presets[0], device="cuda",
                          precision=args.precision)
        for q, peak in peaks.items():
            print(f"{q} GEMM peak on the GPU (8192^3 matmul through CuPy, best of 5): "
                  f"{peak:.1f} GFLOP/s")
    from minibert import BertConfig
    results = []
    for preset in args.presets:
        config = BertConfig.from_preset(preset, vocab_size=args.vocab_size)
        times = {(s, q): [] for s in systems for q in args.precision}
        for _ in range(args.rounds):
            for system in systems:
                found = run_child(
                    __file__, system, preset, batch_size=args.batch_size,
                    seq_len=args.seq_len, vocab_size=args.vocab_size, steps=args.steps,
                    warmup=args.warmup, device=args.device,
                    precision=args.precision)
                for q, ts in found.items():
                    times[system, q] += ts
        for q in args.precision:
            row = report_row(config, preset, q, {s: times[s, q] for s in systems},
                             peaks.get(q), args)
            results.append(row)
            print(f"{preset:>6} {q}: minibert {row['minibert_tokens_per_s']:>7.0f} tok/s "
                  f"({row['minibert_s_per_step']:.4f} s/step) | " + " | ".join(
                      f"{s} {row[f'{s}_tokens_per_s']:>7.0f} tok/s "
                      f"({row[f'ratio_minibert_over_{s}']:.2f}x)" for s in systems[1:])
                  + f" | minibert {row['minibert_gflop_per_s']:.0f} GFLOP/s"
                  + (f", MFU {row['minibert_mfu']:.2f}" if "minibert_mfu" in row else ""),
                  flush=True)
    print("\n".join(speed_table(results)))
    print(json.dumps({"speed": results}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def report_row(config, preset: str, precision: str, times: dict[str, list[float]], peak,
               args) -> dict:
    """One result row: each system's median seconds per step and tokens/s, minibert's ratio
    to each peer, the step's GFLOP, minibert's GFLOP/s and, with a GEMM ``peak``, the MFU
    of minibert and of PyTorch's equal work."""
    tokens = args.batch_size * args.seq_len
    row = {"preset": preset, "device": args.device, "precision": precision,
           "batch": args.batch_size, "seq_len": args.seq_len, "vocab": args.vocab_size,
           "rounds": args.rounds, "steps_per_round": args.steps}
    for name, ts in times.items():
        med = statistics.median(ts)
        row[f"{name}_s_per_step"] = round(med, 5)
        row[f"{name}_tokens_per_s"] = round(tokens / med, 1)
    for peer in list(times)[1:]:
        row[f"ratio_minibert_over_{peer}"] = round(
            row["minibert_tokens_per_s"] / row[f"{peer}_tokens_per_s"], 3)
    flops = step_flops(config, args.batch_size, args.seq_len, 20)
    row["step_gflop"] = round(flops / 1e9, 2)
    row["minibert_gflop_per_s"] = round(flops / row["minibert_s_per_step"] / 1e9, 1)
    if peak:
        row["gemm_peak_gflop_per_s"] = round(peak, 1)
        row["minibert_mfu"] = round(row["minibert_gflop_per_s"] / peak, 3)
        if "torch_equal_work" in times:
            row["torch_equal_work_mfu"] = round(
                flops / row["torch_equal_work_s_per_step"] / 1e9 / peak, 3)
    return row


if __name__ == "__main__":
    sys.exit(main())
