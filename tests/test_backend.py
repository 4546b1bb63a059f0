"""Device selection on a machine without a GPU, and the CuPy path where one exists.

The CUDA start-up check is tested here without a GPU through a fake ``cupy`` / ``cupyx``
injected into ``sys.modules``: host NumPy arrays stand in for device memory, and each test
makes one piece fail the way CuPy 14 fails when a CUDA toolkit wheel is missing (the error
texts are those CuPy 14.2 gives on a machine without the libraries).
"""
import collections
import sys
import types

import numpy as np
import pytest
import scipy.special

from minibert import backend
from minibert.testing import gpu_available


def test_unknown_device_is_rejected():
    with pytest.raises(backend.BackendError, match="unknown device 'tpu'"):
        backend.set_device("tpu")


def test_device_from_environment(monkeypatch):
    monkeypatch.setenv("MINIBERT_DEVICE", "cpu")
    assert backend.set_device() == "cpu"
    monkeypatch.setenv("MINIBERT_DEVICE", "gpu0")
    with pytest.raises(backend.BackendError, match="unknown device 'gpu0'"):
        backend.set_device()


@pytest.mark.skipif(gpu_available(), reason="checks the error when CUDA is missing: runs "
                                             "without a GPU only")
def test_cuda_without_gpu_names_the_missing_piece():
    with pytest.raises(backend.BackendError, match="CuPy|CUDA GPU"):
        backend.set_device("cuda")
    assert backend.get_device() == "cpu"


def test_derived_seeds_are_stable_and_distinct():
    assert backend.derive_seed(0, 5) == backend.derive_seed(0, 5)
    assert len({backend.derive_seed(0, s) for s in range(100)}) == 100


# --------------------------------------------------------------------------------------------
# The start-up check, through a fake CuPy

NVRTC_MISSING = RuntimeError(
    'Failure finding "libnvrtc.so.13 or libnvrtc.so.12": No such file: libnvrtc.so.13 or '
    'libnvrtc.so.12, No such file: libnvrtc.so.13 or libnvrtc.so.12')
CUBLAS_MISSING = ImportError(
    'Failure finding "libcublasLt.so.13 or libcublasLt.so.12": No such file: libcublasLt.so.13 '
    'or libcublasLt.so.12')
CURAND_MISSING = ImportError(
    'Failure finding "libcurand.so.11 or libcurand.so.10": No such file: libcurand.so.11 or '
    'libcurand.so.10')
NO_KERNEL_IMAGE = RuntimeError(
    "cudaErrorNoKernelImageForDevice: no kernel image is available for execution on the device")
LAUNCH_FAILURE = RuntimeError("cudaErrorLaunchFailure: unspecified launch failure")

PROBES = ("elementwise", "matmul", "erf", "default_rng", "philox")


def make_fake_cupy(fail=None, wrong=(), cc="90", devices=1):
    """A stand-in for ``cupy`` and ``cupyx.scipy.special`` on host arrays.

    Args:
        fail: {probe: exception} raised by that probe ("elementwise", "matmul", "erf",
            "default_rng", "philox", or "curand_lib" for loading cupy.cuda.curand).
        wrong: probes that return a wrong value instead of raising.
        cc: the compute capability string CuPy reports ("90" for 9.0).
        devices: what getDeviceCount returns.
    Returns:
        (modules for sys.modules, Counter of probe calls, list of recorded TF32 calls)
    """
    fail = dict(fail or {})
    calls = collections.Counter()
    tf32_calls = []

    def probe(name):
        calls[name] += 1
        if name in fail:
            raise fail[name]

    class FakeArray(np.ndarray):
        """Host memory standing in for device memory."""

        def __matmul__(self, other):
            probe("matmul")
            out = np.matmul(np.asarray(self), np.asarray(other))
            return dev(out + 1 if "matmul" in wrong else out)

    def dev(a):
        return np.asarray(a).view(FakeArray)

    cupy = types.ModuleType("cupy")
    cupy.__version__ = "14.2.0+fake"
    cupy.float32 = np.float32
    cupy.asarray = lambda a, dtype=None: dev(np.asarray(a, dtype))
    cupy.asnumpy = lambda a: np.asarray(a)

    class ElementwiseKernel:
        def __init__(self, in_params, out_params, operation, name):
            assert (in_params, out_params) == ("float32 x", "float32 y")
            self.operation = operation

        def __call__(self, x):
            probe("elementwise")
            x = np.asarray(x)
            return dev(2 * x + 1 + (5 if "elementwise" in wrong else 0))
    cupy.ElementwiseKernel = ElementwiseKernel

    class Generator:
        def __init__(self, seed):
            self._rng = np.random.default_rng(seed)

        def random(self, size, dtype=np.float64):
            probe("default_rng")
            r = self._rng.random(size, dtype=dtype)
            return dev(r + 1 if "default_rng" in wrong else r)

    class RandomState:
        def __init__(self, seed, method):
            assert method == 1005
            self._rng = np.random.default_rng(seed)

        def random_sample(self, size, dtype=np.float64):
            probe("philox")
            r = self._rng.random(size, dtype=dtype)
            return dev(np.zeros_like(r) if "philox" in wrong else r)
    cupy.random = types.SimpleNamespace(default_rng=Generator, RandomState=RandomState)

    class FakeRuntime:
        @staticmethod
        def getDeviceCount():
            if "device_count" in fail:
                raise fail["device_count"]
            return devices

        @staticmethod
        def deviceSynchronize():
            calls["sync"] += 1

        @staticmethod
        def getDeviceProperties(i):
            return {"name": b"NVIDIA Fake H100", "totalGlobalMem": 80 * 2**30}

        runtimeGetVersion = staticmethod(lambda: 12090)
        driverGetVersion = staticmethod(lambda: 12040)

    class FakeDevice:
        id = 0
        compute_capability = cc

    class Cuda(types.ModuleType):
        runtime = FakeRuntime
        Device = FakeDevice
        nvrtc = types.SimpleNamespace(getVersion=lambda: (12, 9))
        cublas = types.SimpleNamespace(
            setMathMode=lambda handle, mode: tf32_calls.append(("math_mode", handle, mode)))

        @staticmethod
        def get_cublas_handle():
            return 4242

        @property
        def curand(self):
            if "curand_lib" in fail:
                raise fail["curand_lib"]
            return types.SimpleNamespace(CURAND_RNG_PSEUDO_PHILOX4_32_10=1005)
    cupy.cuda = Cuda("cupy.cuda")

    linalg = types.ModuleType("cupy._core._routines_linalg")
    linalg.COMPUTE_TYPE_DEFAULT, linalg.COMPUTE_TYPE_TF32 = 1, 7
    core = types.ModuleType("cupy._core")
    core._routines_linalg = linalg
    core.set_compute_type = lambda dtype, t: tf32_calls.append(("compute_type", np.dtype(dtype), t))
    cupy._core = core

    def erf(x):
        probe("erf")
        y = scipy.special.erf(np.asarray(x))
        return dev(-y if "erf" in wrong else y)
    special = types.ModuleType("cupyx.scipy.special")
    special.erf = erf
    cupyx_scipy = types.ModuleType("cupyx.scipy")
    cupyx_scipy.special = special
    cupyx = types.ModuleType("cupyx")
    cupyx.scipy = cupyx_scipy
    modules = {"cupy": cupy, "cupy._core": core, "cupy._core._routines_linalg": linalg,
               "cupyx": cupyx, "cupyx.scipy": cupyx_scipy, "cupyx.scipy.special": special}
    return modules, calls, tf32_calls


@pytest.fixture
def fake_cuda(monkeypatch):
    """Install a fake CuPy (arguments as make_fake_cupy); backend state is restored after."""
    monkeypatch.setattr(backend, "_device", "cpu")
    monkeypatch.setattr(backend, "_cupy_checked", None)
    monkeypatch.setattr(backend, "_tf32", False)

    def install(**kwargs):
        modules, calls, tf32_calls = make_fake_cupy(**kwargs)
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        return modules["cupy"], calls, tf32_calls
    return install


def test_cuda_start_up_check_passes_once_and_summarises_the_device(fake_cuda):
    cupy, calls, _ = fake_cuda()
    assert backend.set_device("cuda") == "cuda"
    assert backend.get_device() == "cuda"
    assert [calls[p] for p in PROBES] == [1, 2, 1, 1, 1]     # matmul: 2-D and batched
    assert calls["sync"] == 6                                # each probe synchronised
    assert backend.set_device("cuda") == "cuda"              # once per process
    assert backend.xp_for() is cupy and backend.xp_for("cuda") is cupy
    assert [calls[p] for p in PROBES] == [1, 2, 1, 1, 1]
    assert backend.device_summary() == {
        "device": "cuda", "index": 0, "name": "NVIDIA Fake H100", "compute_capability": "9.0",
        "total_memory_gib": 80.0, "cuda_runtime": "12.9", "cuda_driver": "12.4",
        "nvrtc": "12.9", "cupy": "14.2.0+fake", "tf32": False}
    assert backend.device_summary("cpu") == {"device": "cpu", "numpy": np.__version__}


@pytest.mark.parametrize("fail, expected, not_named", [
    # the elementwise kernel cannot load NVRTC (the "failed to load libnvrtc")
    ({"elementwise": NVRTC_MISSING},
     (r"device 'cuda': CUDA's runtime compiler \(NVRTC\) could not be loaded: RuntimeError: "
      r"Failure finding \"libnvrtc"), ("cuBLAS", "cuRAND", "erf")),
    ({"matmul": CUBLAS_MISSING},
     r"device 'cuda': cuBLAS could not be loaded: ImportError: .*libcublasLt", ("NVRTC", "cuRAND")),
    # a library named in the error wins over the probe that met it
    ({"matmul": NVRTC_MISSING}, r"\(NVRTC\) could not be loaded", ("cuBLAS",)),
    ({"erf": LAUNCH_FAILURE},
     (r"erf from cupyx\.scipy\.special .* failed the start-up check \(erf of \[0, 0\.5, -1, "
      r"2\]\): RuntimeError: cudaErrorLaunchFailure"), ("cuBLAS", "cuRAND")),
    ({"default_rng": NO_KERNEL_IMAGE},
     (r"cuRAND \(cupy\.random\) failed the start-up check \(cupy\.random\.default_rng\(0\)"
      r".*no kernel image"), ("NVRTC", "cuBLAS")),
    ({"curand_lib": CURAND_MISSING},
     r"cuRAND \(cupy\.random\) could not be loaded: ImportError: .*libcurand", ("cuBLAS",)),
])
def test_cuda_start_up_check_names_the_failing_piece(fake_cuda, fail, expected, not_named):
    _, calls, _ = fake_cuda(fail=fail)
    with pytest.raises(backend.BackendError, match=expected) as info:
        backend.set_device("cuda")
    message = str(info.value)
    assert "pip install 'minibert[gpu]' (cupy-cuda12x[ctk]" in message
    for piece in not_named:
        assert piece not in message.split("; ")[0], message
    assert info.value.__cause__ is next(iter(fail.values()))
    assert backend.get_device() == "cpu"
    assert backend._cupy_checked is None           # a failure is not remembered as a pass
    # it fails at once: no probe after the failing one ran
    failed = next(iter(fail))
    later = PROBES[PROBES.index(failed) + 1:] if failed in PROBES else ()
    assert all(calls[p] == 0 for p in later), calls


@pytest.mark.parametrize("wrong, expected", [
    ("elementwise", (r"\(NVRTC\) gave a wrong result .*got \[ 6\.  8\. 10\. 12\.\], "
                     r"expected \[1\. 3\. 5\. 7\.\]")),
    ("matmul", r"cuBLAS gave a wrong result in the start-up check \(a float32 matmul"),
    ("erf", r"erf from cupyx\.scipy\.special .*gave a wrong result"),
    ("default_rng", r"cuRAND \(cupy\.random\) gave a wrong result .*default_rng"),
    ("philox", r"cuRAND \(cupy\.random\) gave a wrong result .*Philox"),
])
def test_cuda_start_up_check_rejects_wrong_results(fake_cuda, wrong, expected):
    fake_cuda(wrong={wrong})
    with pytest.raises(backend.BackendError, match=expected):
        backend.set_device("cuda")
    assert backend.get_device() == "cpu"


def test_cuda_without_cupy_or_without_a_gpu(fake_cuda, monkeypatch):
    fake_cuda(fail={"device_count": RuntimeError(
        "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime")})
    with pytest.raises(backend.BackendError, match="no CUDA GPU is usable.*InsufficientDriver"):
        backend.set_device("cuda")
    fake_cuda(devices=0)
    with pytest.raises(backend.BackendError, match="sees no CUDA GPU"):
        backend.set_device("cuda")
    monkeypatch.setitem(sys.modules, "cupy", None)           # import cupy -> ImportError
    with pytest.raises(backend.BackendError, match=r"needs CuPy, which is not installed: "
                                                   r"pip install 'minibert\[gpu\]'"):
        backend.set_device("cuda")
    assert backend.get_device() == "cpu"


def test_tf32_needs_the_gpu(fake_cuda):
    assert backend.get_device() == "cpu"
    with pytest.raises(backend.BackendError, match="--tf32 needs --device cuda"):
        backend.set_tf32(True)
    assert backend.set_tf32(False) is False                  # disabling on the CPU: a no-op
    assert backend.get_tf32() is False


def test_tf32_sets_both_cupy_switches(fake_cuda):
    _, _, tf32_calls = fake_cuda(cc="80")
    backend.set_device("cuda")
    assert backend.set_tf32(True) is True
    assert tf32_calls == [("compute_type", np.dtype(np.float32), 7), ("math_mode", 4242, 3)]
    assert backend.get_tf32() and backend.device_summary()["tf32"] is True
    assert backend.set_tf32(False) is False
    assert tf32_calls[2:] == [("compute_type", np.dtype(np.float32), 1), ("math_mode", 4242, 0)]
    assert backend.device_summary()["tf32"] is False


def test_tf32_refuses_a_gpu_before_ampere(fake_cuda):
    _, _, tf32_calls = fake_cuda(cc="75")
    backend.set_device("cuda")
    with pytest.raises(backend.BackendError, match=r"compute capability >= 8\.0.*this one is 7\.5"):
        backend.set_tf32(True)
    assert tf32_calls == [] and backend.get_tf32() is False
    assert backend.set_tf32(False) is False                  # full float32 is always allowed
