import time

import pytest
import torch

from decodelab.timing import synced_seconds


def test_synced_seconds_measures_the_call():
    calls = []
    elapsed = synced_seconds(lambda: (calls.append(1), time.sleep(0.02)), "cpu")
    assert calls == [1]
    assert 0.02 <= elapsed < 1.0


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
