"""torch.use_deterministic_algorithms. The CPU backend is deterministic in every form and runs
under it silently. A CUDA backward then runs its deterministic form (bl_attn_desc::deterministic),
and where a call has none (millions of keys) it raises, or warns with warn_only=True, and runs
the fastest form. The CUDA paths end to end are in tests/gpu; here the pieces that need no
device."""
import ctypes
import warnings

import pytest
import torch

import back_lite
from back_lite import _lib, ops
from determinism import deterministic_algorithms
from inputs import random_qkv


@pytest.mark.parametrize("on", [False, True])
def test_the_deterministic_form_is_asked_of_cuda_only(on):
    with deterministic_algorithms(on):
        assert ops.determinism_required(torch.device("cuda", 0)) is on
        assert not ops.determinism_required(torch.device("cpu"))


def test_a_call_without_a_deterministic_form_is_refused():
    with deterministic_algorithms(), \
            pytest.raises(RuntimeError, match=r"no deterministic form.*\(seqlen_k = 3300000\).*"
                                              r"use_deterministic_algorithms\(True\)"):
        ops.no_deterministic_form("seqlen_k = 3300000")


def test_a_call_without_a_deterministic_form_warns_under_warn_only():
    with deterministic_algorithms(warn_only=True), \
            pytest.warns(UserWarning,
                         match=r"no deterministic form.*\(seqlen_k = 3300000\).*warn_only"):
        ops.no_deterministic_form("seqlen_k = 3300000")


def test_the_descriptor_field_reaches_the_library():
    """bl_attn_desc::deterministic through ctypes (BlAttnDesc mirrors the C struct): the library
    validates the value it reads there, so a wrong offset would not name the field."""
    q = torch.zeros(1, 64, 2, 64)
    desc = ops._desc(q, q, 0.125, False)
    tm, tn = ctypes.c_int64(), ctypes.c_int64()
    for value in (0, 1):
        desc.deterministic = value
        _lib.check(_lib.lib.bl_num_tiles(ctypes.byref(desc), ctypes.byref(tm), ctypes.byref(tn)),
                   "bl_num_tiles")
    desc.deterministic = 2
    with pytest.raises(ValueError, match=r"desc->deterministic must be 0 or 1, got 2"):
        _lib.check(_lib.lib.bl_num_tiles(ctypes.byref(desc), ctypes.byref(tm), ctypes.byref(tn)),
                   "bl_num_tiles")


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


def test_the_call_asks_for_the_deterministic_form(monkeypatch):
    """deterministic=True (FlashAttention's argument) reaches the library's backward call on
    every path: autograd eager and through the op, back_lite.backward with and without
    caller-owned buffers; False by default. (What CUDA does with it: tests/gpu.)"""
    seen = []
    launch = ops._launch_backward

    def spy(*args):
        seen.append(args[14] if len(args) > 14 else "absent")
        return launch(*args)

    monkeypatch.setattr(ops, "_launch_backward", spy)
    q, k, v = random_qkv(1, 70, 90, 2, 1, 64, torch.float32)
    dout = torch.randn(q.shape)
    out, lse, _ = back_lite.forward(q, k, v)
    for flag in (False, True):
        seen.clear()
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        o, _, _ = back_lite.attention(qg, kg, vg, deterministic=flag)
        o.backward(dout)
        o, _, _ = torch.ops.back_lite.attention(qg, kg, vg, 0.125, False, 0.0, False, flag)
        o.backward(dout)
        back_lite.backward(dout, q, k, v, out, lse, deterministic=flag)
        back_lite.backward(dout, q, k, v, out, lse, dq=torch.empty_like(q), deterministic=flag)
        assert seen == [flag] * 4
    seen.clear()
    back_lite.backward(dout, q, k, v, out, lse)
    assert seen == [False]


def test_deterministic_must_be_a_bool():
    q, k, v = random_qkv(1, 70, 90, 2, 1, 64, torch.float32)
    with pytest.raises(TypeError, match="deterministic must be a bool, got str"):
        back_lite.attention(q, k, v, deterministic="yes")
    out, lse, _ = back_lite.forward(q, k, v)
    with pytest.raises(TypeError, match="deterministic must be a bool, got NoneType"):
        back_lite.backward(torch.ones_like(q), q, k, v, out, lse, deterministic=None)
