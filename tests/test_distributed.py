"""Data parallelism (minibert.distributed): row sharding, the communicator's start-up, and
real 2-rank runs under ``mpirun`` (Open MPI + mpi4py, which the README's test command
installs): equivalence with one process, identical parameters on every rank after every
step, a failing or killed rank stopping the job, both jobs end to end, and a resume on
another world size."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minibert import distributed
from minibert.checkpoint import load_checkpoint
from minibert.distributed import (OPEN_MPI_AS_ROOT, Communicator, DistributedError,
                                  init_distributed, shard_rows)
from helpers import records

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "mpi_worker.py"
# Open MPI refuses to run as root without these (CI runs as root), and a 2-core machine
# needs --oversubscribe for 2 ranks when hyperthreads are not counted as slots
MPI_ENV = {**OPEN_MPI_AS_ROOT,
           "OMP_NUM_THREADS": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def mpirun(n, *cmd, timeout=300, check=True):
    exe = shutil.which("mpirun")
    assert exe, "mpirun not found: install Open MPI (apt-get install openmpi-bin), see README"
    env = {**os.environ, **MPI_ENV}
    proc = subprocess.run([exe, "-np", str(n), sys.executable, *map(str, cmd)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def wait_for_owner_to_die(directory: Path, timeout: float = 60) -> None:
    """Wait until no process holds the run directory's lock (``runs.lock_run_dir``)."""
    import fcntl
    t0 = time.time()
    while (directory / ".lock").exists():
        with open(directory / ".lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
                return
            except BlockingIOError:
                assert time.time() - t0 < timeout, f"{directory} still locked"
        time.sleep(0.05)


def single(*cmd, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in distributed._LAUNCHER_SIZE_VARS}
    proc = subprocess.run([sys.executable, *map(str, cmd)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


# --------------------------------------------------------------------- in one process
@dataclass
class Toy:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    labels: np.ndarray | None
    index: np.ndarray
    name: str = "kept"


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 12), W=st.integers(1, 5))
def test_shards_cover_the_batch_once_and_weights_sum_to_one(B, W):
    batch = Toy(np.arange(B * 3).reshape(B, 3), np.ones((B, 3)), np.arange(B) * 10, np.arange(B))
    shards = [shard_rows(batch, r, W) for r in range(W)]
    real = [s for s, w in shards if w > 0]
    np.testing.assert_array_equal(np.concatenate([s.index for s in real]), np.arange(B))
    np.testing.assert_array_equal(np.concatenate([s.labels for s in real]), np.arange(B) * 10)
    assert sum(w for _, w in shards) == pytest.approx(1.0)
    for s, w in shards:
        assert w == pytest.approx(len(s.index) / B if w else 0.0)
        assert len(s.input_ids) == len(s.attention_mask) >= 1 and s.name == "kept"
    sizes = [len(s.index) for s, w in shards if w > 0]
    assert max(sizes) - min(sizes) <= 1           # as even as the rows allow
    # fewer rows than ranks: the ranks left over run one stand-in row at weight 0
    assert sum(1 for _, w in shards if w == 0) == max(0, W - B)


def test_none_fields_and_one_rank():
    batch = Toy(np.ones((4, 2)), np.ones((4, 2)), None, np.arange(4))
    assert shard_rows(batch, 0, 1) == (batch, 1.0)
    shard, w = shard_rows(batch, 1, 2)
    assert shard.labels is None and w == 0.5 and list(shard.index) == [2, 3]


def test_backend_choice(monkeypatch):
    for var in distributed._LAUNCHER_SIZE_VARS:
        monkeypatch.delenv(var, raising=False)
    try:
        comm = init_distributed("auto", "cpu")
        assert (comm.name, comm.rank, comm.world_size) == ("none", 0, 1)
        assert distributed.current() is comm
        buf = np.arange(3.0)
        assert comm.allreduce_(buf) is buf and list(buf) == [0, 1, 2]
        with pytest.raises(DistributedError, match="nccl needs --device cuda"):
            init_distributed("nccl", "cpu")
        with pytest.raises(DistributedError, match="expected one of"):
            init_distributed("gloo", "cpu")
        monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")  # a launcher with one rank: none
        assert init_distributed("auto", "cpu").name == "none"
    finally:
        distributed._current = Communicator()


def test_resume_notice_and_description():
    comm = Communicator()
    assert distributed.resume_notice(1, comm) is None
    assert "written by a run on 2 rank(s); this run has 1" in distributed.resume_notice(2, comm)
    comm.world_size = 3
    assert distributed.describe(comm, 8) == ("data parallel: 3 ranks over none, global batch "
                                             "8 = 2-3 rows per rank")


# -------------------------------------------------------------------- under mpirun
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-10), ("float32", 2e-6)])
def test_two_ranks_equal_one_process_and_agree_after_every_step(tmp_path, dtype, tol):
    """Global batch 7 over 22 rows: ranks get 3 and 4 rows, and the epoch's last batch of 1
    row leaves rank 1 a stand-in row of weight 0. Rank 1 starts from other weights (the
    broadcast must fix that). Dropout off: the same arithmetic as one process."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    single(WORKER, "train", one, dtype, 6, 7)
    mpirun(2, WORKER, "train", two, dtype, 6, 7)
    ranks = json.loads((two / "ranks.json").read_text())
    assert ranks == {"world_size": 2, "max_rank_difference": 0.0}
    a, b = np.load(one / "params.npy"), np.load(two / "params.npy")
    assert np.max(np.abs(a - b)) <= tol * max(1.0, np.max(np.abs(a)))
    ra, rb = records(one), records(two)
    assert [r["step"] for r in rb] == list(range(1, 7))      # rank 0 alone writes, once a step
    assert [r["count"] for r in rb] == [7, 7, 7, 1, 7, 7]    # sums of both ranks' rows
    np.testing.assert_allclose([r["loss"] for r in rb], [r["loss"] for r in ra], rtol=tol)
    np.testing.assert_allclose([r["accuracy"] for r in rb], [r["accuracy"] for r in ra])


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_rank_stops_the_others(tmp_path, how):
    t0 = time.time()
    proc = mpirun(2, WORKER, how, tmp_path, timeout=120, check=False)
    assert proc.returncode != 0
    assert time.time() - t0 < 60
    if how == "raise":
        assert "rank 1 fails on purpose" in proc.stderr
        assert "rank 1: aborting all 2 ranks" in proc.stderr


@pytest.fixture(scope="session")
def corpus(moby30):
    return moby30


def pretrain_args(corpus, out, *extra):
    return [ROOT / "train_mlm.py", "--corpus", corpus, "--output-dir", out, "--vocab-size", "300",
            "--hidden-size", "32", "--num-hidden-layers", "2", "--max-seq-length", "32",
            "--max-steps", "6", "--log-every", "1", "--eval-every", "3", "--save-every", "3",
            "--eval-fraction", "0.1", "--eval-instances", "8", "--dtype", "float64",
            "--no-progress", *extra]


@pytest.mark.parametrize("model, task", [("bert", "nsp"), ("albert", "sop")])
def test_train_mlm_two_ranks_equal_accumulation_in_one_process(corpus, tmp_path, model, task):
    """Rank r trains on rows r*B/2.. of each global batch and draws dropout stream r of the
    step: exactly micro-batch r of one process with batch B/2 and 2 accumulation steps, so
    the two agree in float64 with dropout on (ALBERT: its shared layer's gradient is
    all-reduced like any other)."""
    two, one = tmp_path / "two", tmp_path / "one"
    objective = ("--objective", f"mlm+{task}")   # packed pairs: the same rows either way
    proc = mpirun(2, *pretrain_args(corpus, two, "--batch-size", "8", "--model", model,
                                    *objective))
    assert proc.stdout.count("data parallel: 2 ranks over mpi, global batch 8 = 4 rows") == 1
    assert proc.stdout.count("summary:") == 1                  # rank 0 alone prints
    shutil.copy(two / "vocab.txt", tmp_path / "vocab.txt")
    single(*pretrain_args(corpus, one, "--batch-size", "4", "--gradient-accumulation-steps",
                          "2", "--vocab", tmp_path / "vocab.txt", "--model", model,
                          *objective))
    r2, r1 = records(two), records(one)
    assert [r["step"] for r in r2] == list(range(1, 7))
    for key in ("loss", "mlm_loss", f"{task}_loss", "grad_norm", "mlm_acc"):
        np.testing.assert_allclose([r[key] for r in r2], [r[key] for r in r1], rtol=1e-9,
                                   err_msg=key)
    assert len(records(two, "eval")) == 2   # evaluated once per eval step
    m2, m1 = load_checkpoint(two / "checkpoint.npz"), load_checkpoint(one / "checkpoint.npz")
    assert m2["trainer"]["world_size"] == 2 and m1["trainer"]["world_size"] == 1
    for name, value in m1["model"].items():
        np.testing.assert_allclose(m2["model"][name], value, rtol=1e-9, atol=1e-12,
                                   err_msg=name)


def test_resume_on_another_world_size_continues_the_data_stream(corpus, tmp_path):
    """A 2-rank run killed after its step-3 checkpoint, resumed by one process: with dropout
    off the resumed curve is the uninterrupted 2-rank curve (to round-off)."""
    extra = ("--batch-size", "8", "--hidden-dropout-prob", "0",
             "--attention-probs-dropout-prob", "0")
    full, cut = tmp_path / "full", tmp_path / "cut"
    mpirun(2, *pretrain_args(corpus, full, *extra))
    cut.mkdir()
    shutil.copy(full / "vocab.txt", tmp_path / "vocab.txt")
    env = {**os.environ, **MPI_ENV}
    proc = subprocess.Popen([shutil.which("mpirun"), "-np", "2", sys.executable,
                             *map(str, pretrain_args(corpus, cut, *extra, "--vocab",
                                                     tmp_path / "vocab.txt"))],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.time()
    while proc.poll() is None and not (cut / "checkpoint.npz").exists() and time.time() - t0 < 120:
        time.sleep(0.01)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for_owner_to_die(cut)     # the ranks may outlive mpirun's SIGKILL for a moment
    step = load_checkpoint(cut / "checkpoint.npz", arrays=False)["trainer"]["step"]
    out = single(ROOT / "train_mlm.py", "--resume", cut, "--no-progress").stdout
    print(f"killed after the checkpoint of step {step}")
    assert "written by a run on 2 rank(s); this run has 1" in out
    a, b = records(full), records(cut)
    assert [r["step"] for r in b] == list(range(1, 7))
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=1e-9)


def test_finetune_two_ranks_equal_one_process(tmp_path):
    """finetune.py under mpirun: the same run as one process (dropout off, float32)."""
    from minibert import BertConfig, BertForPreTraining
    from minibert.checkpoint import save_checkpoint
    rng = np.random.default_rng(0)
    words = ["good", "bad", "film", "plot", "very", "not", "a", "the"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    init = tmp_path / "init"
    init.mkdir()
    (init / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=16,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    save_checkpoint(init / "checkpoint.npz", BertForPreTraining(config, seed=1),
                    trainer_state={"args": {"lowercase": True}, "step": 0})
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 21), ("dev", 6)):
        rows = []
        for _ in range(n):
            y = int(rng.integers(0, 2))
            rows.append(f"{'pos' if y else 'neg'}\t{' '.join(rng.choice(words[2:], 3))} "
                        f"{'good' if y else 'bad'}")
        (data / f"{split}.tsv").write_text("label\tsentence\n" + "\n".join(rows) + "\n")
    common = [ROOT / "finetune.py", "--init", init, "--data", data, "--test", "none",
              "--batch-size", "5", "--epochs", "2", "--classifier-dropout", "0", "--lr", "1e-3",
              "--log-every", "1", "--max-seq-length", "12", "--no-progress"]
    mpirun(2, *common, "--output-dir", tmp_path / "two")
    single(*common, "--output-dir", tmp_path / "one")
    r2, r1 = records(tmp_path / "two"), records(tmp_path / "one")
    assert len(r2) == len(r1) == 10
    np.testing.assert_allclose([r["loss"] for r in r2], [r["loss"] for r in r1], rtol=2e-6)
    assert [r["real_tokens"] for r in r2] == [r["real_tokens"] for r in r1]
    assert len(records(tmp_path / "two", "eval")) == 2
    for name in ("summary.json", "best_model.npz", "predictions_dev.tsv"):
        assert (tmp_path / "two" / name).is_file()
    m2 = load_checkpoint(tmp_path / "two/checkpoint.npz")["model"]
    m1 = load_checkpoint(tmp_path / "one/checkpoint.npz")["model"]
    for name, value in m1.items():
        np.testing.assert_allclose(m2[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


def test_bad_input_under_mpirun_is_one_error_line_and_no_hang(tmp_path, corpus):
    proc = mpirun(2, *pretrain_args(corpus, tmp_path / "r", "--batch-size", "1"), check=False,
                  timeout=120)
    assert proc.returncode != 0
    assert "error: --batch-size 1 is the global batch, split over 2 ranks" in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------ two "machines": network namespaces
AGENT = """#!/bin/sh
# Open MPI's remote launcher ("plm_rsh_agent"): instead of `ssh HOST CMD`, run CMD in the
# network namespace that plays HOST
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
  NS_IP_A) ns=NS_A ;;
  NS_IP_B) ns=NS_B ;;
  *) echo "unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" sh -c "$*"
"""


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces needs root "
                    "(CI runs as root)")
def test_two_hosts_over_tcp_in_network_namespaces(tmp_path):
    """Two network namespaces joined by a veth pair stand for two machines: mpirun runs in
    the first, starts rank 1 in the second through a launcher agent (where ssh would go),
    and the ranks talk over TCP only (btl tcp,self). The equivalence check again."""
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b, veth_a, veth_b = f"mbA{tag}", f"mbB{tag}", f"mbva{tag}", f"mbvb{tag}"
    ip_a, ip_b = "10.231.7.1", "10.231.7.2"
    agent = tmp_path / "agent"
    agent.write_text(AGENT.replace("NS_IP_A", ip_a).replace("NS_IP_B", ip_b)
                     .replace("NS_A", ns_a).replace("NS_B", ns_b))
    agent.chmod(0o755)
    try:
        sh("ip", "netns", "add", ns_a)
        sh("ip", "netns", "add", ns_b)
        sh("ip", "link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        for ns, veth, addr in ((ns_a, veth_a, ip_a), (ns_b, veth_b, ip_b)):
            sh("ip", "link", "set", veth, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
            sh("ip", "-n", ns, "link", "set", veth, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        one, two = tmp_path / "one", tmp_path / "two"
        one.mkdir(), two.mkdir()
        single(WORKER, "train", one, "float64", 6, 7)
        env = {**os.environ, **MPI_ENV}
        subnet = "10.231.7.0/24"
        proc = subprocess.run(
            ["ip", "netns", "exec", ns_a, shutil.which("mpirun"), "--host", f"{ip_a},{ip_b}",
             "-np", "2", "--mca", "plm_rsh_agent", str(agent), "--mca", "btl", "tcp,self",
             "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet,
             *(a for v in MPI_ENV for a in ("-x", v)), "-x", "PATH",
             sys.executable, "-c", "import os, pathlib, subprocess, sys; pathlib.Path("
             + repr(str(tmp_path)) + ", 'rank' + os.environ['OMPI_COMM_WORLD_RANK'])"
             ".write_text(str(subprocess.run(['ip', '-o', '-4', 'addr'], capture_output=True,"
             " text=True).stdout.count('" + ip_b + "'))); "
             "sys.argv = sys.argv[1:]; exec(open(sys.argv[0]).read())",
             str(WORKER), "train", str(two), "float64", "6", "7"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        # rank 1 ran where the second "machine's" address lives, rank 0 did not (each rank
        # writes its own file: the two ranks' stdout lines can interleave mid-line)
        where = [(tmp_path / f"rank{r}").read_text() for r in (0, 1)]
        assert where == ["0", "1"], where
        assert json.loads((two / "ranks.json").read_text())["max_rank_difference"] == 0.0
        a, b = np.load(one / "params.npy"), np.load(two / "params.npy")
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-10)
    finally:
        for ns in (ns_a, ns_b):  # deleting a namespace deletes its end of the veth pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
