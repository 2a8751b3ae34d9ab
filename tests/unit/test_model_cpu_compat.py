"""The CPU compatibility layer: pinned to the Megatron-Core it was written for, and working."""

from __future__ import annotations

import pytest
import torch

from gagar.trainer.model import cpu_compat


def test_patched_upstream_sources_are_unchanged() -> None:
    """Fails loudly when a Megatron-Core release changes a function the CPU patches replace or
    depend on: re-check cpu_compat.py against the new code, then update PATCHED_SOURCES."""
    assert cpu_compat.megatron_version() in cpu_compat.SUPPORTED_VERSIONS, (
        f"megatron-core {cpu_compat.megatron_version()} is not in SUPPORTED_VERSIONS: "
        "re-check gagar/trainer/model/cpu_compat.py"
    )
    assert cpu_compat.changed_sources() == [], "upstream changed under the CPU patches"


def test_unknown_version_is_refused_unless_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_compat, "megatron_version", lambda: "0.99.0")
    monkeypatch.delenv(cpu_compat.OVERRIDE_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"0\.99\.0.*GAGAR_ALLOW_UNTESTED_MEGATRON"):
        cpu_compat.check_version()
    monkeypatch.setenv(cpu_compat.OVERRIDE_ENV, "1")
    cpu_compat.check_version()


def test_fingerprint_detects_a_changed_function(monkeypatch: pytest.MonkeyPatch) -> None:
    target = "megatron.core.utils:GlobalMemoryBuffer.get_tensor"
    monkeypatch.setitem(cpu_compat.PATCHED_SOURCES, target, "0" * 16)
    assert cpu_compat.changed_sources() == [target]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the patches apply only without a GPU")
def test_patches_give_cpu_mask_buffer_and_rng_streams() -> None:
    assert cpu_compat.apply()
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.utils import GlobalMemoryBuffer

    mask = fused_softmax.get_default_causal_mask(3)
    assert mask.device.type == "cpu" and mask.tolist()[0] == [False, True, True]
    assert GlobalMemoryBuffer().get_tensor((2, 3), torch.float32, "x").device.type == "cpu"

    tracker = mrandom.CudaRNGStatesTracker()
    tracker.add("a", 11)
    torch.manual_seed(0)
    outside = torch.get_rng_state()
    with tracker.fork("a"):
        first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outside)  # the outer stream is untouched
    with tracker.fork("a"):
        second = torch.rand(3)
    assert not torch.equal(first, second)  # the named stream advanced
    expected = torch.rand(6, generator=torch.Generator().manual_seed(11))
    assert torch.equal(torch.cat([first, second]), expected)
    with pytest.raises(RuntimeError, match="already exists"):
        tracker.add("b", 11)
