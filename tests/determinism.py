"""torch.use_deterministic_algorithms for the length of a block, the caller's mode restored after
(tests/test_deterministic.py, tests/gpu/test_gpu_attention.py)."""
import contextlib

import torch


@contextlib.contextmanager
def deterministic_algorithms(on: bool = True, warn_only: bool = False):
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(on, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
