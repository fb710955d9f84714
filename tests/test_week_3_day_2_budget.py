"""Week 3 Day 2: the paged pool's budget and what may be allocated are measured
against the device's memory: a GPU's own as MLX reports it (mx.device_info(), faked
here for a Mac and a CUDA machine), the machine's RAM on a CPU."""

import mlx.core as mx
import pytest

from tiny_llm_base import EngineConfig, memory
from tiny_llm_base.device import PATHS_VARIABLE

from .helpers import kv_bytes_a_token

# The KV budget the PagedKvManager (task 4) is given.
pytestmark = pytest.mark.task(4)

GIB = 2**30
# What mx.device_info() reports: a Mac's GPU (Metal), a CUDA GPU, a CPU.
METAL = {"memory_size": 16 * GIB, memory.METAL_WORKING_SET: 12 * GIB}
CUDA = {memory.CUDA_TOTAL: 24 * GIB, memory.CUDA_FREE: 20 * GIB}
CPU = {"architecture": "x86_64", "device_name": "a CPU"}


@pytest.fixture
def fake_device(monkeypatch):
    """fake(paths, info): the device switch on `paths`' side, MLX reporting `info`
    and holding 2 GiB, this machine 64 GiB of RAM with 48 GiB available."""

    def fake(paths: str, info: dict) -> None:
        monkeypatch.setenv(PATHS_VARIABLE, paths)
        monkeypatch.setattr(mx, "device_info", lambda: info)
        monkeypatch.setattr(mx, "get_active_memory", lambda: 2 * GIB)
        monkeypatch.setattr(memory, "physical_memory", lambda: 64 * GIB)
        monkeypatch.setattr(memory, "available_memory", lambda: 48 * GIB)

    return fake


@pytest.mark.parametrize(
    "paths, info, free",
    [
        ("gpu", METAL, 10 * GIB),  # the working set less what MLX holds
        ("gpu", CUDA, 20 * GIB),  # the GPU's free memory
        ("gpu", CPU, 48 * GIB),  # a CPU on the GPU's side: MLX reports no memory
        ("cpu", CUDA, 48 * GIB),  # the CPU's side: RAM, whatever MLX reports
    ],
    ids=["metal", "cuda", "cpu-as-gpu", "cpu"],
)
def test_the_default_kv_budget_is_half_the_devices_free_memory(
    fake_device, pair, paths, info, free
):
    model = pair[1]
    fake_device(paths, info)
    config = EngineConfig(kv_cache="paged", block_size=16, max_seq_len=64)
    block = 16 * kv_bytes_a_token(model)
    assert config.pool_blocks(model) == free // 2 // block


@pytest.mark.parametrize(
    "paths, info, have",
    [("gpu", METAL, 12), ("gpu", CUDA, 24), ("cpu", CUDA, 64)],
    ids=["metal", "cuda", "cpu"],
)
def test_what_cannot_fit_the_devices_memory_is_refused(fake_device, paths, info, have):
    """check_fits measures against the GPU's memory on a GPU (less than the
    machine's 64 GiB here), against the machine's on a CPU."""
    fake_device(paths, info)
    memory.check_fits(have * GIB, "the pool", "lower it")
    with pytest.raises(ValueError, match=f"this device has {have}.0 GiB: lower it"):
        memory.check_fits(have * GIB + 1, "the pool", "lower it")
