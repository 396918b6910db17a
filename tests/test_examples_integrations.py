"""The integration examples in examples/ run to the end on this machine (CPU backend without a
GPU), so that they keep working as the package changes; what they compute is checked by
test_integrations.py and test_flash_attn.py. train_video_dit.py has its own test_example.py."""
import importlib.util
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
TIMEOUT_S = 300


@pytest.mark.parametrize("script,needs,expected", [
    ("sdpa_drop_in.py", None, "attention calls {'back_lite': 2, 'torch': 0}"),
    ("flash_attn_drop_in.py", None, "step 2: loss"),
    ("hf_transformers_llama.py", "transformers", "attn_implementation = back_lite"),
    ("diffusers_video_transformer.py", "diffusers", "'sdpa_wrapped': 4"),
])
def test_integration_example_runs(script, needs, expected):
    if needs is not None and importlib.util.find_spec(needs) is None:
        pytest.skip(f"{needs} is not installed (pip install '.[integrations]')")
    done = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                          text=True, timeout=TIMEOUT_S, cwd=EXAMPLES.parent / "tests")
    assert done.returncode == 0, done.stdout + done.stderr
    assert expected in done.stdout, done.stdout
    assert "step 2: loss" in done.stdout, done.stdout
