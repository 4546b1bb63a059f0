"""A training step replayed from CUDA graphs (``--cuda-graphs``, minibert/graphs.py; issue
52, item 3), and the capture rules the CuPy stand-in (tests/fakecupy.py) holds a step to.

On a machine without a GPU these run through the stand-in, which refuses what a capture
refuses and replays the recorded launches on the same buffers; on a GPU the tests that
compare with the uncaptured step run against the real CuPy and nvmath-python."""
import numpy as np
import pytest

from minibert import backend
from minibert.fast import fast_paths
from minibert.selftest import mini_train_step
from test_train_mlm import corpus  # noqa: F401  (the fixture: 40 chapters of Moby-Dick)

pytestmark = pytest.mark.gpu


def stand_in_only(cuda):
    if not cuda.stand_in:
        pytest.skip("the capture rules are those of the NumPy stand-in (tests/fakecupy.py)")


def capture(cupy, body, allocator=None):
    """``body()`` captured on a fresh stream; returns (graph, what body returned)."""
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            if allocator is None:
                out = body()
            else:
                with cupy.cuda.using_allocator(allocator):
                    out = body()
        finally:
            graph = stream.end_capture()
    return graph, out


def test_a_replay_reruns_the_launches_on_the_same_buffers(cuda):
    """The capture changes no buffer (a GPU runs nothing while it records); each launch of
    the graph reads the inputs' current values and writes the same outputs."""
    stand_in_only(cuda)
    import cupy
    x = cupy.asarray(np.arange(4, dtype=np.float32))
    acc = cupy.zeros(4, np.float32)
    kept = []

    def keep(size):
        kept.append(cupy.get_default_memory_pool().malloc(size))
        return kept[-1]

    def body():
        y = x * 2 + 1
        acc[...] += y
        return y
    graph, y = capture(cupy, body, keep)
    assert np.array_equal(cupy.asnumpy(acc), np.zeros(4))        # nothing ran for real
    graph.launch()
    x[...] = 10
    graph.launch()
    np.testing.assert_array_equal(cupy.asnumpy(y), np.full(4, 21))
    np.testing.assert_array_equal(cupy.asnumpy(acc), np.arange(4) * 2 + 1 + 21)
    with cuda.record() as seen:
        graph.launch()
    assert len(seen.launches) == 1                                # one launch a replay


@pytest.mark.parametrize("what", ["cuBLAS through CuPy", "host read", "upload", "cuRAND",
                                  "another stream"])
def test_what_a_capture_refuses_raises_while_capturing(cuda, what):
    stand_in_only(cuda)
    import cupy
    a = cupy.ones((4, 4), np.float32)
    other = cupy.cuda.Stream(non_blocking=True)

    def on_other_stream():
        with other:
            return a + 1
    body = {"cuBLAS through CuPy": lambda: a @ a, "host read": lambda: float(a.sum()),
            "upload": lambda: cupy.asarray(np.ones(3)),
            "cuRAND": lambda: cupy.random.RandomState(0).random_sample((2,)),
            "another stream": on_other_stream}[what]
    with pytest.raises((RuntimeError, NotImplementedError)):
        capture(cupy, body)
    body()                                                        # outside a capture: fine


def test_a_graph_whose_buffer_went_back_to_the_pool_refuses_to_launch(cuda):
    """A temporary of the captured work freed after the capture would be handed to the
    next allocation while a replay writes it; kept by an allocator, it is not."""
    stand_in_only(cuda)
    import cupy
    x = cupy.ones(8, np.float32)
    graph, _ = capture(cupy, lambda: None if (x * 3).sum() is None else None)
    with pytest.raises(RuntimeError, match="went back to the memory pool"):
        graph.launch()
    kept = []
    graph, _ = capture(cupy, lambda: None if (x * 3).sum() is None else None,
                       lambda size: kept.append(cupy.get_default_memory_pool().malloc(size))
                       or kept[-1])
    graph.launch()


@pytest.mark.parametrize("dtype, steps", [("float32", 50), ("float16", 20)])
def test_graphed_steps_give_the_losses_of_uncaptured_ones(cuda, dtype, steps):
    """``steps`` mini steps (dropout, clipping, AdamW with bias correction; float16: master
    weights and the loss scale) through GraphedStep against train_step: the same losses
    (bitwise in the stand-in, which replays the same NumPy operations; float32 round-off on
    a GPU), one graph captured (at the second step), and each replay one launch with no
    host read. Dropout on every replay draws the masks the uncaptured step draws: new
    seeds come through the device buffer, not baked into the graph."""
    import cupy
    backend.set_device("cuda")
    with fast_paths(True):
        eager, graphed = mini_train_step(dtype), mini_train_step(dtype, graphed=True)
        a = [float(eager()[0]) for _ in range(steps)]
        b, launches = [], []
        for _ in range(steps):
            with cuda.record() as seen:
                out = graphed()
            launches.append(len(seen.launches))
            b.append(float(out[0]))
    runner = graphed.graphed
    assert runner.fallback is None and runner.captured == 1
    if cuda.stand_in:
        assert a == b
        assert launches[2:] == [1] * (steps - 2)
    else:
        np.testing.assert_allclose(b, a, rtol=2e-5 if dtype == "float32" else 2e-3)
    assert len(set(b)) > steps // 2                    # the run moves: not one replayed value
    del cupy


def test_a_step_that_breaks_a_capture_rule_falls_back_with_the_reason(cuda, capsys):
    """A workload whose forward copies host data each step cannot be captured: the runner
    says why and trains uncaptured, the losses those of train_step."""
    stand_in_only(cuda)
    import cupy
    backend.set_device("cuda")
    with fast_paths(True):
        step = mini_train_step("float32", graphed=True)
        runner = step.graphed
        task = runner._args[2]
        forward = task.forward

        def uploading(model, batch):
            cupy.asarray(np.ones(2))                   # a host-to-device copy
            return forward(model, batch)
        task.forward = uploading
        losses = [float(step()[0]) for _ in range(4)]
        eager = mini_train_step("float32")
        assert losses == [float(eager()[0]) for _ in range(4)]
    assert runner.captured == 0 and "H2D transfers" in runner.fallback
    assert "cuda graphs: off from step 2 (the capture failed" in capsys.readouterr().out


def test_graphs_are_refused_where_a_run_cannot_be_captured():
    from minibert.graphs import status_line, unsupported
    assert unsupported("cpu", 1, True) == "CUDA graphs need --device cuda"
    assert "NCCL" in unsupported("cuda", 2, True)
    assert "fast paths are off" in unsupported("cuda", 1, False)
    assert status_line(False, "cpu", 1) == "cuda graphs: off"
    assert status_line(True, "cpu", 1) == "cuda graphs: off (CUDA graphs need --device cuda)"


def test_train_mlm_with_cuda_graphs_resumes_exactly(cuda, corpus, tmp_path, monkeypatch,
                                                    capsys):
    """train_mlm.py --device cuda --cuda-graphs, stopped after its step-4 checkpoint and
    resumed, gives the curve of a straight run, and both give the curve of
    --no-cuda-graphs (bitwise in the stand-in; float32 round-off on a GPU)."""
    import train_mlm
    from test_train_mlm import args_for, curve, straight_and_resumed
    straight, crashed = straight_and_resumed(corpus, tmp_path, monkeypatch, "--device",
                                             "cuda", "--cuda-graphs")
    assert "cuda graphs: on" in capsys.readouterr().out
    assert curve(crashed) == curve(straight)
    plain = tmp_path / "plain"
    assert train_mlm.main(args_for(corpus, plain, "--device", "cuda", "--no-cuda-graphs")) == 0
    assert "cuda graphs: off\n" in capsys.readouterr().out
    losses = [[r["loss"] for r in curve(run)] for run in (straight, plain)]
    if cuda.stand_in:
        assert losses[0] == losses[1]
    else:
        np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


def test_finetune_with_cuda_graphs_gives_the_uncaptured_losses(cuda, tiny_pretrained,
                                                              classify_task, tmp_path, capsys):
    """finetune.py --device cuda --cuda-graphs captures its step (the task's token counts
    are device values of the static batch, not host reads) and logs the losses of
    --no-cuda-graphs."""
    import finetune
    from helpers import records
    losses = []
    for flag in ("--cuda-graphs", "--no-cuda-graphs"):
        out = tmp_path / flag.lstrip("-")
        assert finetune.main(["--init", str(tiny_pretrained), "--data", str(classify_task),
                              "--output-dir", str(out), "--max-seq-length", "16",
                              "--batch-size", "8", "--max-steps", "6", "--log-every", "1",
                              "--device", "cuda", "--no-progress", flag]) == 0
        losses.append([r["loss"] for r in records(out, "train")])
    printed = capsys.readouterr().out
    assert "cuda graphs: on" in printed and "capture failed" not in printed
    assert len(losses[0]) == 6
    if cuda.stand_in:
        assert losses[0] == losses[1]
    else:
        np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
