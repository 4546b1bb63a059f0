"""Device selection on a machine without a GPU, and the CuPy path where one exists."""
import numpy as np
import pytest

from minibert import BertConfig, BertForPreTraining, backend


def gpu_available() -> bool:
    try:
        backend.set_device("cuda")
        return True
    except backend.BackendError:
        return False
    finally:
        backend.set_device("cpu")


def test_unknown_device_is_rejected():
    with pytest.raises(backend.BackendError, match="unknown device 'tpu'"):
        backend.set_device("tpu")


def test_device_from_environment(monkeypatch):
    monkeypatch.setenv("MINIBERT_DEVICE", "cpu")
    assert backend.set_device() == "cpu"
    monkeypatch.setenv("MINIBERT_DEVICE", "gpu0")
    with pytest.raises(backend.BackendError, match="unknown device 'gpu0'"):
        backend.set_device()


@pytest.mark.skipif(gpu_available(), reason="checks the error when CUDA is missing")
def test_cuda_without_gpu_names_the_missing_piece():
    with pytest.raises(backend.BackendError, match="CuPy|CUDA GPU"):
        backend.set_device("cuda")
    assert backend.get_device() == "cpu"


def test_derived_seeds_are_stable_and_distinct():
    assert backend.derive_seed(0, 5) == backend.derive_seed(0, 5)
    assert len({backend.derive_seed(0, s) for s in range(100)}) == 100


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_cupy_matches_numpy_forward_and_gradients():
    import cupy as cp
    from minibert.modeling import masked_lm_from_labels
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=32, max_position_embeddings=16,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 50, (3, 10))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    labels = np.where(rng.random((3, 10)) < 0.3, ids, -100)
    labels[0, 0] = ids[0, 0]
    nsp = np.array([0, 1, 0])
    cpu = BertForPreTraining(config, dtype=np.float64)
    gpu = BertForPreTraining(config, dtype=np.float64).to("cuda")
    positions, mlm_ids, weights = masked_lm_from_labels(labels)
    out_c = cpu(ids, attention_mask=mask, masked_lm_positions=positions, masked_lm_ids=mlm_ids,
                masked_lm_weights=weights, next_sentence_label=nsp)
    out_g = gpu(cp.asarray(ids), attention_mask=cp.asarray(mask),
                masked_lm_positions=cp.asarray(positions), masked_lm_ids=cp.asarray(mlm_ids),
                masked_lm_weights=cp.asarray(weights), next_sentence_label=cp.asarray(nsp))
    cpu.backward()
    gpu.backward()
    assert abs(float(out_c.loss) - float(out_g.loss)) < 1e-10
    for (n, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
        np.testing.assert_allclose(cp.asnumpy(pg.grad), pc.grad, rtol=1e-9, atol=1e-12, err_msg=n)
