import time

import pytest
import torch

from decodelab.measure.timing import synced_seconds


def test_synced_seconds_measures_the_call(monkeypatch):
    """On a clock that only the call moves, so the figure is exact on any machine."""
    import decodelab.measure.timing

    now = [100.0]
    monkeypatch.setattr(decodelab.measure.timing.time, "perf_counter", lambda: now[0])

    def call():
        now[0] += 0.25

    assert synced_seconds(call, "cpu") == 0.25


def test_synced_seconds_rejects_bad_input():
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        synced_seconds(3, "cpu")
    with pytest.raises(ValueError, match="device must be a torch device .* got 'gpu'"):
        synced_seconds(lambda: None, "gpu")


@pytest.mark.cuda
def test_synced_seconds_waits_for_cuda_kernels():
    a = torch.randn(4096, 4096, device="cuda")

    def work():
        return a @ a @ a @ a

    work()
    torch.cuda.synchronize()  # warm-up: cuBLAS handles, cached memory
    start = time.perf_counter()
    work()
    launch_only = time.perf_counter() - start  # the kernels are queued, not done
    torch.cuda.synchronize()
    assert synced_seconds(work, "cuda") > 10 * launch_only
