"""The guard of the GPU test modules that run the CUDA backend: called at import, it skips the
whole module, saying why, where PyTorch sees no CUDA device or the library has no usable CUDA
backend (CI's machines have no GPU; the lent H200 runs them)."""
import pytest
import torch

import back_lite


def skip_module_without_cuda_backend():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to PyTorch (torch.cuda.is_available() is False)",
                    allow_module_level=True)
    if not back_lite.backend_available("cuda"):
        pytest.skip("the BackLite library has no usable CUDA backend (not compiled in with nvcc, "
                    "or no compute capability 9.0 device)", allow_module_level=True)
