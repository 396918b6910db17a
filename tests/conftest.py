"""Shared pytest setup: the tests import back_lite (the installed package, or the source tree with
BACK_LITE_LIBRARY pointing at a built libbacklite.so) and the reference beside this file."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Small CPU problems: threads beyond the 2 cores of CI only add scheduling noise.
torch.set_num_threads(min(torch.get_num_threads(), 2))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_report_header(config):
    import back_lite

    return (f"back_lite {back_lite.version} from {os.path.dirname(back_lite.__file__)}; "
            f"library {back_lite.library_path}; CUDA backend usable: "
            f"{back_lite.backend_available('cuda')}")
