#!/usr/bin/env python
"""The kernel launches of one mini training step on a GPU against the counts the CuPy
stand-in pins (``minibert.selftest.LAUNCH_PINS``): the self-test's ``speed/launches``
step (issue 52). PyTorch's profiler reads CUPTI, so this lives in bench/, where torch may
be imported, not in minibert/.

    python bench/count_launches.py       # one JSON line: {"ok": ..., "launches": ...}
"""
from __future__ import annotations

import json


def count_launches() -> dict:
    """The GPU work items (kernels, memsets, device-to-device copies: what a host call
    enqueues, host-to-device uploads of the batch left out) of the second mini step in
    float32 and float16, recorded by CUPTI through ``torch.profiler``. Returns
    {"ok": no count above its pin, "launches": {dtype: count}, "pins", "most_frequent":
    the eight commonest kernel names per dtype, "why": the overage or None}. Raises
    minibert.backend.BackendError without a usable GPU."""
    import collections
    from minibert import backend
    from minibert.fast import set_fast_paths
    from minibert.selftest import LAUNCH_PINS, mini_train_step
    backend.set_device("cuda")
    set_fast_paths(True)
    import cupy
    import torch
    from torch.profiler import ProfilerActivity, profile
    found, top = {}, {}
    for dtype in LAUNCH_PINS:
        step = mini_train_step(dtype)
        step()
        cupy.cuda.Device().synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            cupy.cuda.Device().synchronize()
        names = [e.name for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA
                 and not e.name.startswith(("Memcpy HtoD", "Memcpy DtoH"))]
        found[dtype] = len(names)
        top[dtype] = collections.Counter(n[:60] for n in names).most_common(8)
    over = [f"{d} {n} > {LAUNCH_PINS[d]}" for d, n in found.items() if n > LAUNCH_PINS[d]]
    return dict(ok=not over, launches=found, pins=LAUNCH_PINS, most_frequent=top,
                why=f"more launches than the stand-in pins: {', '.join(over)}" if over
                else None)


if __name__ == "__main__":
    result = count_launches()
    print(json.dumps(result, default=str))
