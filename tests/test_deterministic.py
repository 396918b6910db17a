"""torch.use_deterministic_algorithms: the CPU backward is deterministic and runs under it
silently; the CUDA backward's dq is not (README, Reproducibility), so a CUDA backward raises
under it, or warns with warn_only=True. The CUDA path end to end is in tests/gpu; here its check
runs on a torch.device("cuda") object, which needs no device."""
import warnings

import pytest
import torch

import back_lite
from back_lite import ops
from determinism import deterministic_algorithms
from inputs import random_qkv


def test_cuda_backward_is_refused_where_determinism_is_required():
    with deterministic_algorithms(), \
            pytest.raises(RuntimeError, match=r"dq.*use_deterministic_algorithms\(True\)"):
        ops.alert_nondeterministic_backward(torch.device("cuda", 0))


def test_cuda_backward_warns_under_warn_only():
    with deterministic_algorithms(warn_only=True), \
            pytest.warns(UserWarning, match=r"no deterministic implementation of dq.*warn_only"):
        ops.alert_nondeterministic_backward(torch.device("cuda"))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_no_alert_without_determinism_or_on_the_cpu(device):
    # the CPU is checked with determinism on, CUDA with it off
    with deterministic_algorithms(device == "cpu"), warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.alert_nondeterministic_backward(torch.device(device))


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_backward_runs_silently_under_determinism(causal):
    """Every CPU path (autograd, the op, the explicit-mask op) runs with determinism required
    and gives the same bits as without it."""
    q, k, v = random_qkv(1, 150, 200, 4, 2, 64, torch.bfloat16)
    dout = torch.randn(q.shape).to(q.dtype)
    out, lse, w = back_lite.forward(q, k, v, causal=causal, with_stats=True)
    mask = back_lite.select(w, negl_prob=0.1)

    def grads():
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        o = back_lite.BackLite(negl_prob=0.1)(qg, kg, vg, causal=causal)
        auto = torch.autograd.grad(o, (qg, kg, vg), dout)
        sparse = back_lite.backward(dout, q, k, v, out, lse, tile_mass=w, negl_prob=0.1,
                                    causal=causal)
        masked = back_lite.backward(dout, q, k, v, out, lse, mask=mask, causal=causal)
        return (*auto, *sparse, *masked)

    free = grads()
    with deterministic_algorithms(), warnings.catch_warnings():
        warnings.simplefilter("error")
        required = grads()
    for a, b in zip(required, free):
        assert torch.equal(a, b)
