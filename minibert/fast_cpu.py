"""The CPU fast paths: the same formulas as the nn/ reference functions, computed faster.

The layer functions of :mod:`minibert.nn` (``layernorm_forward``, ``softmax_forward``,
``gelu_forward`` ...) and :func:`minibert.optim.adamw_update` are written as the plain
formula, and the formula is what runs until a job switches the fast paths on with
:func:`minibert.fast.set_fast_paths`. Then, on NumPy arrays, each of them asks
:func:`minibert.fast.fast_path` for its entry in :data:`FAST_PATHS` and runs it instead.
What the functions here do that the formulas do not:

- row-parallel passes: a row-wise computation (softmax, LayerNorm, cross-entropy) split into
  row blocks, one per thread, the first on the calling thread (:func:`parallel_rows`);
  NumPy's ufuncs release the GIL;
- the Linear layers' float32 products split by rows over the same threads, with OpenBLAS
  kept to one thread (:func:`split_products`, :func:`matmul`);
- the attention core with the batch split over the threads (:func:`attention_forward`),
  and the dropout mask drawn over them from jumped copies of the generator
  (:func:`keep_mask`: the same mask);
- the bias of a Linear layer added inside the GELU after it (:func:`bias_gelu_forward`);
- cache-sized blocks: a chain of element-wise passes (GELU, AdamW) run on blocks of 1 MiB,
  so the intermediate results stay in cache (:func:`parallel_blocks`);
- ``out=`` buffers and in-place ufuncs instead of a new array for each intermediate;
- for float32 GELU, a rational normal CDF instead of SciPy's erf (:func:`normal_cdf`);
- glibc keeps freed memory for the next step's arrays (:func:`keep_freed_memory`; where
  there is glibc).

Each function gives the same bits as its reference formula (tests/test_fast_cpu.py), except
float32 GELU, whose normal CDF is within 2.5e-7 of the exact one. The GPU runs the reference
formulas (and the fused kernels of :mod:`minibert.gpu_kernels`). Measurements:
docs/performance.md.
"""
from __future__ import annotations

import itertools
import math
import os
import threading

import numpy as np

from .backend import compute_dtype, erf, keep_threshold, keep_mask as formula_mask


# --- threads ---------------------------------------------------------------------------

def cpu_threads() -> int:
    """Threads for CPU element-wise work outside BLAS: ``OMP_NUM_THREADS`` if set (the
    variable OpenBLAS reads too, so one setting governs both), else the CPUs this process
    may run on."""
    global _affinity
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) >= 1:
        return int(env)
    if _affinity[0] != os.getpid():   # asked of the kernel once a process (~100 calls a step)
        _affinity = (os.getpid(), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                     else os.cpu_count() or 1)
    return _affinity[1]


_affinity = (None, 1)              # (process id, CPUs it may run on)


_workers, _workers_pid = [], None   # the pool's threads (_Worker), and the process they run in
_pass_lock = threading.Lock()       # held by the thread whose pass the pool is running
_in_block = threading.local()       # .active: the calling thread runs its block of a pass
_POOL_PREFIX = "minibert-pool"
_PARALLEL_MIN = 1 << 16        # elements below which one thread is faster


class _Worker:
    """One helper thread of the pool: runs one block at a time, handed over through two
    locks (``go`` released by the caller when a block is set, ``done`` released by the
    thread when it has run it). Two lock hand-overs a block, where a
    ``concurrent.futures`` pool took a queue, a future and a waiter's condition: 43 us a
    pass of two empty blocks on 2 cores with that pool (docs/performance.md)."""

    def __init__(self, name: str):
        self.go, self.done = threading.Lock(), threading.Lock()
        self.go.acquire()
        self.done.acquire()
        self.task, self.result, self.error = None, None, None
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self):
        while True:
            self.go.acquire()
            fn, args = self.task
            try:
                self.result, self.error = fn(*args), None
            except BaseException as error:     # raised again on the caller's thread
                self.result, self.error = None, error
            self.task = None
            self.done.release()

    def submit(self, fn, args) -> None:
        """Start ``fn(*args)`` on this thread."""
        self.task = (fn, args)
        self.go.release()

    def wait(self):
        """Wait for the block and return ``(result, exception or None)``."""
        self.done.acquire()
        return self.result, self.error


def _thread_pool(workers: int) -> list:
    """The process's first ``workers`` helper threads for element-wise NumPy work (NumPy
    ufuncs, BLAS calls and SciPy's erf release the GIL), more made when a pass needs more,
    all made again in a child process after a fork. The calling thread is the other
    worker of a parallel pass (:func:`parallel_rows`), so a pass over t threads uses
    t - 1 of these."""
    global _workers, _workers_pid
    if _workers_pid != os.getpid():
        _workers, _workers_pid = [], os.getpid()
    while len(_workers) < workers:
        _workers.append(_Worker(f"{_POOL_PREFIX}_{len(_workers)}"))
    return _workers[:workers]


def _taking_turns(fn, blocks: list):
    """A function for every thread of a pass to run: it takes the next block not yet
    taken (``next`` on a shared counter is atomic under the GIL) and runs ``fn`` on it,
    until none is left; and the list the results go to, in block order."""
    taken, results = itertools.count(), [None] * len(blocks)

    def run():
        i = next(taken)
        while i < len(blocks):
            results[i] = fn(*blocks[i])
            i = next(taken)

    return run, results


def parallel_rows(fn, *arrays, min_size: int = _PARALLEL_MIN, align: int = 1,
                  chunks: int = 1) -> list:
    """Run ``fn`` on row blocks of the NumPy ``arrays`` at once, one block per :func:`cpu_threads`
    thread, and return the results in block order.

    ``fn(*blocks)`` gets ``a[lo:hi]`` of every array (views, split on axis 0; all arrays
    share that axis) and must only touch its own rows, e.g. a row-wise softmax writing
    into an ``out`` array passed among ``arrays``. For a row-wise computation the result is
    the same bits as one call on the whole arrays. The first block runs on the calling
    thread while the pool's threads run the others (the caller would otherwise sit idle
    waiting, and one hand-over fewer is the larger part of a pass's cost on small arrays);
    the call returns when every block is done, also when one of them raised (the first
    exception, the caller's own first, is raised then). One call, no threads, when the
    arrays are smaller than ``min_size`` elements or have fewer rows than threads, or
    when called from inside a block of another pass: from one of the pool's own threads
    (a pool thread waiting on the pool would deadlock it) or from the caller's own block
    (the pool's threads are busy with the other blocks), or while another thread's pass
    holds the pool. ``chunks`` > 1: ``chunks`` blocks a thread, each thread taking the
    next block not yet taken until none is left (a thread that starts late, or loses its
    core for a while, takes fewer); the results still in block order. ``align``: every
    block but the last starts and ends at a multiple of this many rows (blocks may then
    be empty).
    """
    threads = cpu_threads()
    n = arrays[0].shape[0]
    if (threads == 1 or arrays[0].size < min_size or n < threads
            or getattr(_in_block, "active", False)
            or threading.current_thread().name.startswith(_POOL_PREFIX)
            or not _pass_lock.acquire(blocking=False)):    # another thread's pass is running
        return [fn(*arrays)]
    try:
        # block i starts at the multiple of align nearest to i n / threads (rounding down
        # instead left the calling thread waiting: 256 of 614 rows against the pool's 358)
        pieces = threads * max(1, chunks)
        unit = pieces * align
        bounds = [min(n, (n * i + unit // 2) // unit * align) for i in range(pieces)] + [n]
        blocks = [[a[lo:hi] for a in arrays] for lo, hi in zip(bounds[:-1], bounds[1:])]
        pool = _thread_pool(threads - 1)
        if pieces == threads:
            run, tasks, results = fn, blocks, None
        else:                      # every thread takes blocks until none is left
            run, results = _taking_turns(fn, blocks)
            tasks = [()] * threads
        for worker, task in zip(pool, tasks[1:]):
            worker.submit(run, task)
        _in_block.active = True
        try:
            first = run(*tasks[0])
        finally:                   # no block may still be writing when the caller goes on
            _in_block.active = False
            done = [worker.wait() for worker in pool]
    finally:
        _pass_lock.release()
    for _, error in done:
        if error is not None:
            raise error
    return results if results is not None else [first, *(result for result, _ in done)]


# --- matrix products -------------------------------------------------------------------

_blas_saved = None      # [(set_threads, count before)] while the products are split here
_GEMM_ALIGN = 64        # a split product's blocks start at multiples of this many rows
_GEMM_MIN_COLS = 16     # a product with fewer columns (or a shorter sum) is not split
_GEMM_MIN_FLOPS = 1 << 24   # 16 MFLOP (about 0.2 ms on one core): smaller, one call
_GEMM_CHUNKS = 4            # at most this many blocks a thread, taken as threads come free,
_GEMM_CHUNK_ROWS = 256      # each of at least this many rows


def _openblas_controls() -> list:
    """(get, set) thread-count functions of every OpenBLAS the process has loaded, found
    by threadpoolctl, which lists a process's libraries on Linux, macOS and Windows alike
    and knows the builds' symbol names (NumPy's and SciPy's wheels, a system OpenBLAS);
    [] where there is none (another BLAS: macOS's Accelerate, MKL; a static build) or
    the libraries cannot be listed."""
    try:
        from threadpoolctl import ThreadpoolController
        libs = ThreadpoolController().select(internal_api="openblas").lib_controllers
    except (ImportError, OSError):
        return []
    return [(lib.get_num_threads, lib.set_num_threads) for lib in libs
            if isinstance(lib.get_num_threads(), int)]     # None: no count to restore


def _release_blas_control() -> None:
    """Let another thread set OpenBLAS's threads again: threadpoolctl 3.8 lets only one
    thread at a time set the count of a process-wide OpenBLAS pool (the first to set it,
    until it lets go, as its own ``threadpool_limits`` does on leaving)."""
    try:
        from threadpoolctl import OpenBLASController
    except ImportError:
        return
    clear = getattr(OpenBLASController, "clear_controlling_thread", None)
    if clear is not None:
        clear()


def split_products(enabled: bool) -> bool:
    """Take the threads of the matrix products over, or give them back to the BLAS.

    On: every OpenBLAS of the process runs on one thread, and :func:`matmul` splits a
    product's rows over :func:`cpu_threads` threads itself (the pool of
    :func:`parallel_rows`). A GEMM of the default run (4096 x 128 times 128 x 384, about
    0.4 GFLOP) is small for OpenBLAS's own threads: they spin while waiting for work, and
    on a machine whose other core is busy a step took 3x as long with them as on one
    thread (docs/performance.md). Our blocks hand over once per product and wait without
    spinning. The bits are the same: a row block's product is computed as the rows of
    the whole one (OpenBLAS splits rows, never the sum, across its own threads too), as
    long as the blocks start at multiples of the kernels' row unrolling (64 rows here:
    a block ending mid-unroll takes the edge kernels, whose sums run in another order)
    and stay large (OpenBLAS's small-matrix kernels are another order too);
    tests/test_fast_cpu.py. Off: the counts from before are restored.
    Called by :func:`minibert.fast.set_fast_paths`; process-wide. The cost: the products
    that :func:`matmul` does not split run on one thread while this is on (float64
    products, attention's batched ones, which OpenBLAS runs on one thread anyway at
    T = 32 but not at the mini preset's T = 128, and any ``@`` outside the layers).

    The OpenBLAS libraries are found through threadpoolctl (:func:`_openblas_controls`):
    on macOS and Windows too, where there is no ``/proc/self/maps`` to read.

    Returns:
        Whether the products are split here now (False, with nothing changed, where no
        OpenBLAS thread control is found: macOS's Accelerate, MKL, a static build; or
        where another thread holds threadpoolctl's control of OpenBLAS's threads).
    """
    global _blas_saved
    if enabled and _blas_saved is None:
        controls = _openblas_controls()
        if controls:
            saved = [(put, get()) for get, put in controls]
            for put, _ in saved:
                put(1)
            if all(get() == 1 for get, _ in controls):
                _blas_saved = saved
            else:                   # not ours to set now: put back what was changed
                for put, count in saved:
                    put(count)
                _release_blas_control()
    elif not enabled and _blas_saved is not None:
        for put, count in _blas_saved:
            put(count)
        _blas_saved = None
        _release_blas_control()
    return _blas_saved is not None


def openblas_kernels() -> list:
    """The core types (kernels) of the OpenBLAS libraries in this process, as threadpoolctl
    reports them ("SkylakeX", "Haswell", ...), sorted; [] where it finds none."""
    try:
        from threadpoolctl import threadpool_info
        return sorted({str(i.get("architecture")) for i in threadpool_info()
                       if i.get("internal_api") == "openblas"})
    except (ImportError, OSError):
        return []


def products_line() -> str:
    """How the float32 products of the Linear layers run now, for a job's first log lines:
    split here over :func:`cpu_threads` threads with OpenBLAS on one, or on the BLAS's own
    threads (no OpenBLAS thread control found, or the fast paths off), with the OpenBLAS
    kernels threadpoolctl reports (SkylakeX, Haswell ...: an AVX2 CPU runs Haswell's),
    so that a slow run on another CPU says what it ran."""
    kernels = openblas_kernels()
    blas = f"OpenBLAS {'/'.join(kernels)} kernel" if kernels else "no OpenBLAS found"
    if _blas_saved is not None:
        return f"products split over {cpu_threads()} threads, {blas} on 1 thread"
    return f"products on the BLAS's own threads, {blas}"


def matmul(a, b):
    """``a @ b`` for 2-D NumPy arrays (any strides), with a's rows in blocks over the
    threads when the products are split here (:func:`split_products`), both are float32
    and the product is large enough (>= 16 MFLOP, >= 64 rows a thread, >= 16 columns and
    terms); else one call. The same bits as ``a @ b`` either way (blocks of whole 64-row
    units; float64 products are never split: OpenBLAS's double kernels gave other bits
    for a block in about one case in five). Returns a new (M, N) array."""
    threads = cpu_threads()
    (m, k), n = a.shape, b.shape[1]
    if (_blas_saved is None or threads == 1 or m < threads * _GEMM_ALIGN
            or a.dtype != np.float32 or b.dtype != np.float32
            or min(k, n) < _GEMM_MIN_COLS or 2 * m * k * n < _GEMM_MIN_FLOPS):
        return a @ b
    out = np.empty((m, n), dtype=np.result_type(a, b))
    parallel_rows(lambda rows, out_rows: np.matmul(rows, b, out=out_rows), a, out,
                  min_size=0, align=_GEMM_ALIGN,
                  chunks=min(_GEMM_CHUNKS, m // (threads * _GEMM_CHUNK_ROWS)))
    return out


def linear_forward(x, w, b=None):
    """:func:`minibert.nn.linear.linear_forward`, its product split over the threads
    (:func:`matmul`)."""
    x2 = x.reshape(-1, x.shape[-1])                      # (N, I)
    out = matmul(x2, w.T)                                # (N, O)
    if b is not None:
        out += b
    return out.reshape(*x.shape[:-1], w.shape[0]), (x, w, b is not None)


def linear_backward(dout, cache):
    """:func:`minibert.nn.linear.linear_backward`, each product split over the threads
    (:func:`matmul`)."""
    x, w, has_bias = cache
    d2 = dout.reshape(-1, dout.shape[-1])                # (N, O)
    x2 = x.reshape(-1, x.shape[-1])                      # (N, I)
    # forward: out = x @ w.T + b
    dx = matmul(d2, w).reshape(x.shape)                  # (..., I)
    dw = matmul(d2.T, x2)                                # (O, I)
    db = d2.sum(axis=0) if has_bias else None            # (O,)
    return dx, dw, db


_CACHE_BLOCK = 1 << 18          # elements per block of a chain of passes: 1 MiB of float32


def _cache_row_blocks(n_rows: int, n_cols: int) -> list:
    """Slices that cut ``n_rows`` rows of ``n_cols`` elements into blocks of about
    ``_CACHE_BLOCK`` elements (at least one row each): a row pass's chain of ufuncs runs
    on one block while it is in cache."""
    rows = max(1, _CACHE_BLOCK // max(n_cols, 1))
    return [slice(lo, lo + rows) for lo in range(0, n_rows, rows)]


def parallel_blocks(fn, *arrays, block: int | None = None) -> None:
    """Run the element-wise ``fn`` over blocks of ``block`` elements of ``arrays``, the
    blocks shared out over :func:`cpu_threads` threads.

    A chain of NumPy ufuncs over arrays larger than the cache reads and writes main
    memory once per ufunc; on blocks of about 1 MiB the chain's intermediate results stay
    in cache. Smaller blocks lose more to the GIL hand-over between the two threads than
    they gain (measured on 2 cores: 64 Ki elements per block ran 1.6x slower on 2 threads
    than 256 Ki).

    Args:
        fn: ``fn(*views)`` gets the same ``[lo:hi]`` slice of every array, flattened to
            1-d, and must write only there (an element-wise computation into an ``out``
            passed among ``arrays``); its result is ignored.
        arrays: NumPy arrays with the same number of elements. C-contiguous ones are
            split; otherwise (a strided view) ``fn`` gets the whole arrays in one call, so
            it must not depend on their shape.
        block: elements per block, >= 1 (default ``_CACHE_BLOCK``).
    """
    block = block or _CACHE_BLOCK
    if not all(a.flags.c_contiguous for a in arrays):
        fn(*arrays)
        return

    def run(*part):  # one thread's share, block by block
        for lo in range(0, max(part[0].size, 1), block):
            fn(*(a[lo:lo + block] for a in part))

    parallel_rows(run, *(a.reshape(-1) for a in arrays), min_size=2 * block)


# --- memory ----------------------------------------------------------------------------

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameters (malloc.h)
_memory_kept = None


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep freed memory for the next allocation instead of handing it
    back to the kernel (``mallopt``: no mmap below 1 GiB, no trimming of the heap's top).

    A training step allocates and frees the same large arrays every step (activations,
    scores, the MLM logits). By default glibc serves each array above its mmap threshold
    (at most 32 MiB) with a fresh ``mmap`` and unmaps it on free, so every step touches new
    pages. A mini-preset step alone in a process on 2 cores took 2.0 s with about 32,000
    page faults and 0.6 s of kernel time; with this setting, 1.5 s, 4 faults and 0.005 s
    (docs/performance.md). jemalloc and tcmalloc, the allocators PyTorch's CPU tuning guide
    recommends, keep freed memory by default too. The cost: the process keeps its peak heap
    until it exits.
    Called by :func:`minibert.fast.set_fast_paths` when it switches them on;
    process-wide, once.

    Returns:
        True if the settings took (glibc); False where there is no glibc ``mallopt``
        (macOS, musl), where nothing changes.
    """
    global _memory_kept
    if _memory_kept is None:
        import ctypes
        try:
            mallopt = ctypes.CDLL("libc.so.6").mallopt
        except (OSError, AttributeError):
            _memory_kept = False
        else:
            _memory_kept = (mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1
                            and mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1) == 1)
    return _memory_kept


# --- GELU --------------------------------------------------------------------------------

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)

# Phi(x) - 1/2 = x P(x^2) / Q(x^2) on |x| <= 4 sqrt(2), the float32 CPU form of the normal
# CDF. Our own fit: erf(z) = z p(z^2) / q(z^2) (p of degree 6, q of degree 4, q_0 = 1) on
# z in (0, 4], least squares on the linearised relative error (f q - z p) / (f q_prev),
# re-weighted towards the minimax error (Lawson's iteration), in float64 against SciPy's
# erf; then z = x / sqrt(2), with the 1/2 of Phi folded into P. Relative error of the fit
# 6.9e-8; evaluated in float32, |Phi - exact| <= 2.5e-7 for every float32 x
# (tests/test_fast_cpu.py). Beyond |x| = 4 sqrt(2), 1 - Phi(|x|) < 1.6e-8 is below
# float32's resolution next to 1.
_PHI_P = tuple(np.float32(c) for c in (
    3.9894225492669799e-01, 3.6641473833296953e-02, 4.5560608459247597e-03,
    1.7664241801571389e-04, 3.2577720600479364e-06, -2.1463469473045735e-08,
    1.0553505211691192e-10))
_PHI_Q = tuple(np.float32(c) for c in (
    1.0, 2.5851218582671837e-01, 2.9508445029692330e-02, 1.8714236118387957e-03,
    6.3913727298284324e-05))
_PHI_CLIP = np.float32(4.0 * math.sqrt(2.0))


def _horner(coefficients, s, out):
    """out = sum_k coefficients[k] s^k (Horner's rule, in place; out may not be s)."""
    np.multiply(s, coefficients[-1], out=out)
    for k in range(len(coefficients) - 2, -1, -1):
        out += coefficients[k]
        if k:
            out *= s
    return out


def normal_cdf(x, out):
    """The standard normal CDF, Phi(x) = (1 + erf(x / sqrt(2))) / 2, written into ``out``.

    Args:
        x: NumPy float array, any shape. out: array of x's shape and dtype (not x itself).
    Returns:
        ``out``. Float32 input takes the rational form above (25 ufunc passes,
        |error| <= 2.5e-7, about 5x faster than SciPy's erf, which computes in float64
        one scalar at a time); other dtypes use SciPy's erf, exact to the dtype's rounding
        and the same bits as the reference formula ``0.5 * (1 + erf(x / sqrt(2)))``.
    """
    if x.dtype != np.float32:
        np.multiply(x, _SQRT_HALF, out=out)
        erf(out, out=out)
        out += 1.0
        out *= 0.5
        return out
    np.clip(x, -_PHI_CLIP, _PHI_CLIP, out=out)          # c: x clipped
    s = np.multiply(out, out)                            # c^2
    p = _horner(_PHI_P, s, np.empty_like(s))             # P(c^2)
    p *= out                                             # c P(c^2)
    _horner(_PHI_Q, s, out)                              # Q(c^2)
    np.divide(p, out, out=out)
    out += np.float32(0.5)
    return out


def gelu_forward(x):
    """:func:`minibert.nn.activations.gelu_forward` on cache-sized blocks over the threads,
    Phi from :func:`normal_cdf`."""
    cdf, out = np.empty_like(x), np.empty_like(x)

    def block(x, cdf, out):
        normal_cdf(x, cdf)                               # Phi(x)
        np.multiply(x, cdf, out=out)

    parallel_blocks(block, x, cdf, out)
    return out, (x, cdf)


def bias_gelu_forward(x, b):
    """:func:`minibert.nn.activations.bias_gelu_forward`, the bias added inside the GELU's
    cache-sized blocks: z = x + b, Phi(z) (:func:`normal_cdf`) and z Phi(z), each block's
    three passes while it is in cache, instead of a pass over the whole of x for the sum
    and then the GELU's. The same bits as :func:`gelu_forward` of ``x + b`` (every pass
    is element-wise; the blocks are whole rows, so ``b`` lines up with each).

    Args:
        x: (..., I) float NumPy array (the product of a Linear layer without its bias);
            b: (I,) of x's dtype (any other shape or dtype: :func:`gelu_forward` of
            ``x + b``, NumPy's broadcasting and type promotion). Returns out and the
            cache (z, Phi(z)), each of x's shape.
    """
    shape = x.shape
    if x.ndim == 0 or b.shape != shape[-1:] or np.result_type(x, b) != x.dtype:
        return gelu_forward(x + b)
    x2 = x.reshape(-1, shape[-1])                                    # (N, I)
    z, cdf, out = np.empty_like(x2), np.empty_like(x2), np.empty_like(x2)
    def run(x, z, cdf, out):  # one thread's rows, a cache block at a time
        for r in _cache_row_blocks(*x.shape):
            zb = np.add(x[r], b, out=z[r])                           # z = x + b
            normal_cdf(zb, cdf[r])                                   # Phi(z)
            np.multiply(zb, cdf[r], out=out[r])

    parallel_rows(run, x2, z, cdf, out, min_size=2 * _CACHE_BLOCK)
    return out.reshape(shape), (z.reshape(shape), cdf.reshape(shape))


def gelu_backward(dout, cache):
    """:func:`minibert.nn.activations.gelu_backward` on cache-sized blocks over the
    threads, one buffer for every intermediate."""
    x, cdf = cache
    dx = np.empty_like(x)

    def block(x, cdf, dout, d):
        np.multiply(x, x, out=d)
        d *= -0.5
        np.exp(d, out=d)
        d *= _INV_SQRT_2PI                               # phi(x)
        d *= x
        d += cdf                                         # Phi(x) + x phi(x)
        d *= dout

    parallel_blocks(block, x, cdf, dout, dx)
    return dx


# --- row-wise passes -------------------------------------------------------------------

def softmax_forward(x, axis: int = -1, out=None):
    """:func:`minibert.nn.activations.softmax_forward` in place in ``out`` (or one new
    array), row blocks over the threads when ``axis`` is the last."""
    dtype = x.dtype
    if compute_dtype(dtype) != dtype:                    # float16: normalise in float32
        x, out = x.astype(compute_dtype(dtype)), None
    probs = np.empty_like(x) if out is None else out

    def rows(x, probs):
        np.subtract(x, x.max(axis=axis, keepdims=True), out=probs)
        np.exp(probs, out=probs)
        probs /= probs.sum(axis=axis, keepdims=True)

    if axis in (-1, x.ndim - 1) and x.ndim > 1:
        parallel_rows(rows, x, probs)
    else:
        rows(x, probs)
    probs = probs.astype(dtype, copy=False)
    return probs, (probs, axis)


def softmax_backward(dprobs, cache, out=None):
    """:func:`minibert.nn.activations.softmax_backward` into ``out`` (or one new array),
    row blocks over the threads when the axis is the last."""
    probs, axis = cache
    dx = np.empty_like(dprobs) if out is None else out

    def rows(dprobs, probs, dx):
        row = (dprobs * probs).sum(axis=axis, keepdims=True,
                                   dtype=compute_dtype(probs.dtype)).astype(probs.dtype)
        np.subtract(dprobs, row, out=dx)
        dx *= probs

    if axis in (-1, probs.ndim - 1) and probs.ndim > 1:
        parallel_rows(rows, dprobs, probs, dx)
    else:
        rows(dprobs, probs, dx)
    return dx


def layernorm_forward(x, w, b, eps: float = 1e-12):
    """:func:`minibert.nn.layernorm.layernorm_forward`: row blocks over the threads, the
    squares computed in the output buffer."""
    dtype = x.dtype
    x = x.astype(compute_dtype(dtype), copy=False)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])                        # (N, C)
    xhat, out = np.empty_like(x2), np.empty_like(x2)
    rstd = np.empty_like(x2, shape=(len(x2), 1))

    def rows(x, xhat, out, rstd):
        np.subtract(x, x.mean(axis=-1, keepdims=True), out=xhat)
        np.multiply(xhat, xhat, out=out)                              # scratch: squares
        rstd[:] = (out.mean(axis=-1, keepdims=True) + eps) ** -0.5
        xhat *= rstd
        np.multiply(xhat, w, out=out)
        out += b

    parallel_rows(rows, x2, xhat, out, rstd)
    return (out.reshape(shape).astype(dtype, copy=False),
            (xhat.reshape(shape), rstd.reshape(*shape[:-1], 1), w))


def layernorm_backward(dout, cache):
    """:func:`minibert.nn.layernorm.layernorm_backward`: row blocks over the threads, one
    scratch array for every intermediate."""
    xhat, rstd, w = cache
    dtype = dout.dtype
    dout = dout.astype(xhat.dtype, copy=False)
    C = xhat.shape[-1]
    tmp = np.multiply(dout, xhat)                        # (..., C) scratch
    dw = tmp.reshape(-1, C).sum(axis=0)                  # (C,)
    db = dout.reshape(-1, C).sum(axis=0)                 # (C,)
    dx = np.empty_like(tmp)

    def rows(dout, xhat, rstd, tmp, dx):
        np.multiply(dout, w, out=dx)                     # g
        np.multiply(dx, xhat, out=tmp)
        mean_gx = tmp.mean(axis=-1, keepdims=True)       # (n, 1)
        mean_g = dx.mean(axis=-1, keepdims=True)         # (n, 1)
        np.multiply(xhat, mean_gx, out=tmp)
        dx -= tmp
        dx -= mean_g
        dx *= rstd

    parallel_rows(rows, *(a.reshape(-1, a.shape[-1]) for a in (dout, xhat, rstd, tmp, dx)))
    return dx.astype(dtype, copy=False), dw, db


def softmax_nll(logits, labels, label_smoothing: float = 0.0):
    """:func:`minibert.nn.losses.softmax_nll`: row blocks over the threads, the softmax
    computed in place in its own buffer."""
    probs = np.empty_like(logits)                        # (N, K)
    nll = np.empty_like(logits, shape=(len(logits),))    # (N,)

    def rows(logits, labels, probs, nll):
        shifted = np.subtract(logits, logits.max(axis=-1, keepdims=True), out=probs)
        picked = shifted[np.arange(len(labels)), labels]                # (n,)
        mean_shifted = shifted.mean(axis=-1) if label_smoothing else None
        np.exp(shifted, out=probs)
        sumexp = probs.sum(axis=-1)                                     # (n,)
        lse = np.log(sumexp)
        probs /= sumexp[:, None]
        nll[:] = lse - picked
        if label_smoothing:
            nll[:] = (1.0 - label_smoothing) * nll + label_smoothing * (lse - mean_shifted)

    parallel_rows(rows, logits, labels, probs, nll)
    return probs, nll


def cross_entropy_backward(dloss, cache):
    """:func:`minibert.nn.losses.cross_entropy_backward`: the passes after the label's
    column in row blocks over the threads, in place in the cache's softmax."""
    probs, safe, valid, denom, eps, out_dtype = cache
    N, K = probs.shape
    dlogits = probs                                      # (N, K)
    dlogits[np.arange(N), safe] -= 1.0 - eps
    scale = (valid / denom * dloss)[:, None].astype(probs.dtype)     # (N, 1)

    def rows(d, scale):
        if eps:
            d -= eps / K
        d *= scale

    parallel_rows(rows, dlogits, scale)
    return dlogits.astype(out_dtype, copy=False)


# --- dropout -----------------------------------------------------------------------------

_spares = threading.local()      # .generators: this thread's PCG64 generators for keep_mask


def _spare_generator(i: int):
    """The calling thread's i-th spare ``Generator(PCG64)``, made once (a new PCG64 asks
    the OS for entropy and hashes a seed, about 15 us; keep_mask needs one a thread after
    the first, ~10 times a step) and then only given a state to start from; one list a
    thread, so two threads never share one."""
    spares = getattr(_spares, "generators", None)
    if spares is None:
        spares = _spares.generators = []
    while len(spares) <= i:
        spares.append(np.random.Generator(np.random.PCG64(0)))
    return spares[i]


def keep_mask(rng, shape, p: float):
    """:func:`minibert.backend.keep_mask` with the draw split over the threads: the
    same mask, and the generator left in the same state.

    The formula draws ``ceil(n / 2)`` 64-bit words with ``random_raw``, which holds the
    GIL, and compares their 32-bit halves with the threshold. For a PCG64 generator
    (what :class:`~minibert.backend.DropoutRNG` holds on the CPU) the same words come
    from ``Generator.integers(0, 2**64, dtype=uint64)`` (NumPy's full-range draw returns
    the bit generator's words as they are), which runs without the GIL. So the words
    are cut into one run per thread; thread i draws its run from a copy of the
    generator advanced past the runs before it (``PCG64.advance``, an exact jump) and
    compares. The generator then takes the last copy's state, its own buffered 32-bit
    value kept (neither draw touches it; the jump clears it). Any other generator, or
    fewer than ``_PARALLEL_MIN`` elements: the formula (tests/test_fast_cpu.py).
    """
    gen = getattr(rng, "numpy_generator", rng)
    bits = getattr(gen, "bit_generator", None)
    n, threads = math.prod(shape), cpu_threads()
    if (not isinstance(gen, np.random.Generator) or type(bits) is not np.random.PCG64
            or threads == 1 or n < _PARALLEL_MIN):
        return formula_mask(rng, shape, p)
    words = (n + 1) // 2
    starts = [words * i // threads for i in range(threads)] + [words]
    before = bits.state
    copies = [gen]
    for i, start in enumerate(starts[1:-1]):
        copy = _spare_generator(i)
        copy.bit_generator.state = before
        copy.bit_generator.advance(start)
        copies.append(copy)
    threshold = keep_threshold(p)
    keep = np.empty(n, dtype=bool)

    def run(parts):  # the runs of words given: one a thread, or all of them inline
        for i in parts.tolist():
            lo, hi = starts[i], starts[i + 1]
            drawn = copies[i].integers(0, 1 << 64, hi - lo, dtype=np.uint64).view(np.uint32)
            np.greater_equal(drawn[:min(2 * hi, n) - 2 * lo], threshold,
                             out=keep[2 * lo:min(2 * hi, n)])

    parallel_rows(run, np.arange(threads), min_size=0)
    if threads > 1:
        after = copies[-1].bit_generator.state
        after["has_uint32"], after["uinteger"] = before["has_uint32"], before["uinteger"]
        bits.state = after
    return keep.reshape(shape)


def _dropout_rows(x, keep, scale: float, b=None, residual=None):
    """``((x + b) * keep) * scale + residual`` (b and residual optional) in row blocks over
    the threads, each a cache block at a time: the element-wise passes of the dropout
    formulas in their order, so the same bits. x: (..., C); keep: x's shape, bool;
    b: (C,); residual: x's shape. Returns a new array of x's shape."""
    dtype = x.dtype                                      # callers pass one dtype only
    arrays = [a.reshape(-1, x.shape[-1]) for a in (x, keep)]
    out = np.empty(arrays[0].shape, dtype)
    extra = () if residual is None else (residual.reshape(out.shape),)

    def run(x, keep, out, *res):  # one thread's rows, a cache block at a time
        for r in _cache_row_blocks(*x.shape):
            o = out[r]
            if b is None:
                np.multiply(x[r], keep[r], out=o)
            else:
                np.add(x[r], b, out=o)
                o *= keep[r]
            o *= scale
            if res:
                o += res[0][r]

    parallel_rows(run, *arrays, out, *extra, min_size=2 * _CACHE_BLOCK)
    return out.reshape(x.shape)


def _masked_as_written(x, keep, scale: float):
    """``x * keep * scale`` in the nn/dropout formulas' two passes (the same bits and
    dtype), for the inputs the row passes do not take: a scalar, a mask that broadcasts,
    an array that is not a float."""
    out = x * keep
    out *= scale
    return out


def dropout_forward(x, p: float, rng):
    """:func:`minibert.nn.dropout.dropout_forward`: the mask drawn over the threads
    (:func:`keep_mask`), the products in row blocks over them."""
    scale = 1.0 / (1.0 - p)
    if x.ndim == 0 or np.result_type(x.dtype, np.float16) != x.dtype:
        keep = formula_mask(rng, x.shape, p)             # a scalar, or not a float: as written
        return _masked_as_written(x, keep, scale), (keep, scale)
    keep = keep_mask(rng, x.shape, p)
    return _dropout_rows(x, keep, scale), (keep, scale)


def bias_dropout_add_forward(x, b, residual, p: float, rng):
    """:func:`minibert.nn.dropout.bias_dropout_add_forward`: with dropout, the bias, the
    mask, the scale and the residual in one row pass over the threads (the mask drawn
    first, :func:`keep_mask`); the formula's element-wise order, so the same bits."""
    if (p <= 0.0 or x.ndim == 0 or b.shape != x.shape[-1:] or residual.shape != x.shape
            or not x.dtype == b.dtype == residual.dtype):
        y = x + b
        cache = None
        if p > 0.0:
            y, cache = dropout_forward(y, p, rng)
        return y + residual, cache
    keep = keep_mask(rng, x.shape, p)
    scale = 1.0 / (1.0 - p)
    return _dropout_rows(x, keep, scale, b, residual), (keep, scale)


def dropout_backward(dout, cache):
    """:func:`minibert.nn.dropout.dropout_backward` in row blocks over the threads."""
    keep, scale = cache
    if dout.ndim == 0 or keep.shape != dout.shape:         # broadcast or scalar: as written
        return _masked_as_written(dout, keep, scale)
    return _dropout_rows(dout, keep, scale)


# --- attention ---------------------------------------------------------------------------

def attention_forward(qkv, mask_add, num_heads: int, dropout_p: float = 0.0, rng=None,
                      qkv_bias=None):
    """:func:`minibert.nn.attention.attention_forward` with the batch in blocks over the
    threads (:func:`parallel_rows`): each block splits its heads, takes its scores,
    softmax, dropout and weighted sum of values, and writes them into the whole batch's
    arrays. The dropout mask is drawn first for the whole batch, in one
    draw as the formula's (:func:`keep_mask`, the draw itself over the threads), so a
    run's masks are the same bits. The per-matrix products and row-wise passes make every
    result the same bits as the formula's (tests/test_fast_cpu.py). Returns ctx (B, T, C)
    and the fields of :class:`~minibert.nn.attention.AttentionCache` as a tuple (the
    formula's module wraps them; this module does not import it).
    """
    B, T, C3 = qkv.shape
    NH, HS = num_heads, C3 // 3 // num_heads
    scale = 1.0 / math.sqrt(HS)
    dtype = qkv.dtype if qkv_bias is None else np.result_type(qkv, qkv_bias)
    q, k, v = (np.empty((B, NH, T, HS), dtype) for _ in range(3))
    probs = np.empty((B, NH, T, T), dtype)
    keep = keep_mask(rng, probs.shape, dropout_p) if dropout_p > 0.0 else None
    dropped = probs if keep is None else np.empty_like(probs)
    ctx = np.empty((B, T, NH * HS), dtype)
    masks = () if mask_add is None else (np.broadcast_to(mask_add, probs.shape),)
    drops = () if keep is None else (keep, dropped)

    def block(qkv, q, k, v, probs, ctx, *rest):
        # the formula's lines, on rows [lo, hi) of the batch
        if qkv_bias is not None:
            qkv = qkv + qkv_bias                                     # (b, T, 3C)
        heads = qkv.reshape(len(qkv), T, 3, NH, HS).transpose(2, 0, 3, 1, 4)
        np.multiply(heads[0], scale, out=q)
        k[...], v[...] = heads[1], heads[2]
        np.matmul(q, k.transpose(0, 1, 3, 2), out=probs)            # scores
        if masks:
            probs += rest[0]
        p, _ = softmax_forward(probs, axis=-1, out=probs)      # what the formula runs here
        if p is not probs:                                           # float16: a new array
            probs[...] = p
        out = probs
        if drops:
            keep, out = rest[len(masks):]
            np.multiply(probs, keep, out=out)
            out *= 1.0 / (1.0 - dropout_p)
        ctx.reshape(len(ctx), T, NH, HS)[...] = (out @ v).transpose(0, 2, 1, 3)

    parallel_rows(block, qkv, q, k, v, probs, ctx, *masks, *drops, min_size=0)
    dropout_cache = None if keep is None else (keep, 1.0 / (1.0 - dropout_p))
    return ctx, (q, k, v, (probs, -1), dropped, dropout_cache, scale)


def attention_backward(dctx, cache, dprobs, formula):
    """:func:`minibert.nn.attention.attention_backward` with the batch in blocks over the
    threads: each block runs ``formula`` (the caller passes
    :func:`~minibert.nn.attention.attention_backward_formula`) on its rows of the cache,
    so the result is the formula's bits."""
    q, k, v, (probs, axis), dropped, dropout_cache, scale = cache
    B, NH, T, HS = q.shape
    dqkv = np.empty((B, T, 3 * NH * HS), dtype=np.result_type(dctx, q))
    keep = () if dropout_cache is None else (dropout_cache[0],)
    extra = () if dprobs is None else (dprobs,)

    def block(dctx, q, k, v, probs, dropped, dqkv, *rest):
        drop = None if not keep else (rest[0], dropout_cache[1])
        part = cache._replace(q=q, k=k, v=v, softmax=(probs, axis), dropped=dropped,
                              dropout=drop)
        dqkv[...] = formula(dctx, part, rest[len(keep)] if extra else None)

    parallel_rows(block, dctx, q, k, v, probs, dropped, dqkv, *keep, *extra, min_size=0)
    return dqkv


# --- AdamW -------------------------------------------------------------------------------

def adamw_update(p, g, m, v, n_decay: int, lr, step_size, v_scale: float, b1: float,
                 b2: float, eps: float, weight_decay: float, scratch=None) -> None:
    """:func:`minibert.optim.adamw_update` as in-place passes over cache-sized blocks of
    the flat buffers, on the CPU's threads (:func:`parallel_blocks`): the same bits.

    Args: as :func:`minibert.optim.adamw_update`; ``scratch``: a (S,) array of p's dtype
    for the intermediates (a new one when None).
    """
    tmp = np.empty_like(p) if scratch is None else scratch
    if weight_decay and n_decay:
        decay = 1.0 - lr * weight_decay

        def decay_block(q):
            # p -= lr wd p on the matrices, which come first in the buffer
            q *= decay

        parallel_blocks(decay_block, p[:n_decay])

    def block(p, g, m, v, tmp):
        # m = b1 m + (1 - b1) g
        m *= b1
        np.multiply(g, 1.0 - b1, out=tmp)
        m += tmp
        # v = b2 v + g^2 (1 - b2)
        v *= b2
        np.multiply(g, g, out=tmp)
        tmp *= 1.0 - b2
        v += tmp
        # p -= m / (sqrt(v) v_scale + eps) step_size
        np.sqrt(v, out=tmp)
        if v_scale != 1.0:
            tmp *= v_scale
        tmp += eps
        np.divide(m, tmp, out=tmp)
        tmp *= step_size
        p -= tmp

    parallel_blocks(block, p, g, m, v, tmp)


FAST_PATHS = {f.__name__: f for f in (
    linear_forward, linear_backward, attention_forward, attention_backward, dropout_forward,
    bias_dropout_add_forward, dropout_backward, gelu_forward, bias_gelu_forward,
    gelu_backward, softmax_forward, softmax_backward, layernorm_forward, layernorm_backward,
    softmax_nll, cross_entropy_backward, adamw_update)}
"""The name of a formula (an nn/ function, or :func:`minibert.optim.adamw_update`) -> its
CPU fast path (same arguments, same result)."""
