"""Worker slots registered with CUDA (pincollate/_registration.py), with a stand-in runtime."""

from __future__ import annotations

import pytest
import torch

from pincollate._memory import registration as _registration


class _FailingRuntime:
    """cudaHostRegister and cudaHostUnregister that fail, as on a machine out of lockable memory."""

    def cudaHostRegister(self, ptr, nbytes, flags):
        return 2  # cudaErrorMemoryAllocation

    def cudaHostUnregister(self, ptr):
        return 712  # cudaErrorHostMemoryNotRegistered


def test_a_failed_registration_warns_and_clears_the_runtime_error(monkeypatch):
    # Left set, the runtime's last error is raised by torch's next kernel-launch check.
    cleared = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_registration, "cudart", _FailingRuntime)
    monkeypatch.setattr(_registration, "clear_error", lambda: cleared.append(True))
    storage = torch.UntypedStorage(1 << 16)
    with pytest.warns(RuntimeWarning, match=r"cudaHostRegister failed for a worker slot \(error 2\)"):
        assert not _registration.register(storage)
    assert cleared == [True]
    with pytest.warns(RuntimeWarning, match=r"cudaHostUnregister failed for a worker slot \(error 712\)"):
        assert not _registration.unregister(storage.data_ptr())
    assert cleared == [True, True]


def test_the_runtime_error_is_cleared_through_the_runtime_torch_loaded():
    if not torch.version.cuda:
        pytest.skip("a torch built without CUDA has no CUDA runtime to ask")
    runtime = _registration.runtime()
    assert runtime is not None and "libcudart" in runtime._name
    _registration.clear_error()  # without a GPU it reads "no driver", harmlessly
