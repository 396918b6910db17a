"""torch.library custom ops (namespace `back_lite`) that call the C library.

Every op here only allocates outputs and passes pointers, strides and the CUDA stream to
libbacklite; all attention math lives in C. Argument checks with readable messages are done
before these ops are called (back_lite/_checks.py, used by back_lite/functional.py); the C
library checks everything again and its errors surface through back_lite._lib.check.

Ops
  back_lite::attention(q, k, v, scale, causal, negl_prob, with_stats, deterministic=False)
      -> (out, lse, W), differentiable (torch.library.register_autograd); the backward is
      block-sparse when negl_prob > 0 and dense when negl_prob == 0, and in its deterministic
      form (bl_attn_desc::deterministic) when deterministic is True or
      torch.use_deterministic_algorithms(True) is set.
  back_lite::forward(q, k, v, scale, causal, with_stats) -> (out, lse, W)
  back_lite::forward_out(q, k, v, scale, causal, out!, lse!, tile_stats!?) -> ()
  back_lite::backward(dout, q, k, v, out, lse, tile_mass?, negl_prob, mask?, scale, causal,
                      deterministic=False) -> (dq, dk, dv)
  back_lite::backward_out(..., dq!, dk!, dv!, deterministic=False) -> ()
  back_lite::select_tiles(W, negl_prob) -> mask (torch.bool)

W without statistics: when no tile mass is recorded (with_stats False) the W output is an empty
fp32 tensor of shape (B, Hq, 0, 0): same rank and leading dims as a real W, no elements, so code
can test `W.numel() == 0` and fake tensors need no data-dependent shape.
"""
import contextlib
import ctypes
import warnings
from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import _lib, workspace_pool
from ._lib import BlAttnDesc, BlTensor

# torch dtype -> bl_dtype
BL_DTYPES = {
    torch.float32: _lib.BL_DTYPE_F32,
    torch.float16: _lib.BL_DTYPE_F16,
    torch.bfloat16: _lib.BL_DTYPE_BF16,
}

# Selection runs on W alone, but bl_select_tiles takes a full problem description; these values
# stand in for the parts of it that selection does not use (any supported head dim / dtype will do).
_SELECT_HEAD_DIM = 64
_SELECT_DTYPE = _lib.BL_DTYPE_BF16


def backend_of(device: torch.device) -> int:
    """bl_backend for a torch device: CPU tensors run on the CPU backend, CUDA tensors on CUDA."""
    if device.type == "cpu":
        return _lib.BL_BACKEND_CPU
    if device.type == "cuda":
        return _lib.BL_BACKEND_CUDA
    raise ValueError(f"BackLite: tensors on device {device} are not supported (cpu or cuda only)")


def num_tiles(device: torch.device, seqlen_q, seqlen_k):
    """(Tm, Tn) = (ceil(Sq/TM), ceil(Sk/TN)) with the backend's tile shape; works on SymInts."""
    tile_m, tile_n = _lib.tile_shape(backend_of(device))
    return (seqlen_q + tile_m - 1) // tile_m, (seqlen_k + tile_n - 1) // tile_n


def _view(t: torch.Tensor) -> BlTensor:
    # t: (B, S, H, D) with stride(-1) == 1 (checked before); strides in elements.
    return BlTensor(t.data_ptr(), t.stride(0), t.stride(1), t.stride(2))


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _desc(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> BlAttnDesc:
    # q: (B, Sq, Hq, D), k: (B, Sk, Hk, D)
    batch, seqlen_q, heads_q, head_dim = q.shape
    _, seqlen_k, heads_k, _ = k.shape
    return BlAttnDesc(
        backend=backend_of(q.device), dtype=BL_DTYPES[q.dtype], batch=batch, seqlen_q=seqlen_q,
        seqlen_k=seqlen_k, heads_q=heads_q, heads_k=heads_k, head_dim=head_dim,
        scale=float(scale), causal=int(bool(causal)), stream=None, workspace=None,
        workspace_bytes=0)


def require_backend(backend: int) -> None:
    """Raises RuntimeError when the library cannot run `backend` here (CUDA: not compiled in, or
    no compute capability 9.0 device), before any pointer is handed to it."""
    if backend == _lib.BL_BACKEND_CUDA and not _lib.backend_available(backend):
        raise RuntimeError(
            "BackLite: the CUDA backend is not usable: this build of libbacklite "
            f"({_lib.path}) was compiled without nvcc, or no compute capability 9.0 "
            "(H100/H200) device is visible. Rebuild with nvcc 12.3+ on the PATH "
            "(`pip install .`), or use CPU tensors.")


def _untraced() -> bool:
    """True where a call is plain eager execution: nothing traces it (torch.compile, AOTAutograd,
    make_fx), and no dispatch mode, torch-function mode or torch.func transform is active."""
    functorch = getattr(torch._C, "_are_functorch_transforms_active", None)
    return not (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None
                or torch._C._is_torch_function_mode_enabled()
                or (functorch is not None and functorch()))


def direct_call_ok(*tensors: Optional[torch.Tensor]) -> bool:
    """True where an eager call may run an op's implementation below (run_forward, run_backward,
    _launch_forward, _launch_backward) instead of going through torch.ops.back_lite: nothing is
    tracing it (torch.compile, AOTAutograd, make_fx: they see the ops), no dispatch or
    torch-function mode is active (fake tensors, FlopCounterMode, ...), every tensor is a plain
    torch.Tensor, and no autograd graph is being recorded through them (where one is, the op
    path's error on a backward through these no-autograd ops is kept). The dispatcher's own
    path (autograd key, redispatch, torch.library.custom_op's output checks) cost a forward
    12-26 us of host time on the H200 machines' torch 2.11, of ~65-170; for the backward (~100-280)
    the saving was within the host's noise (bench/results/host-s93-call-overhead.txt;
    dev/cuda/host_overhead.py --op-paths)."""
    if not _untraced():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) is not torch.Tensor or (grad and t.requires_grad):
            return False
    return True


@contextlib.contextmanager
def _on_device(desc: BlAttnDesc, device: torch.device, op: int, with_stats: bool):
    """For CUDA: makes `device` current, puts its current stream and a workspace of
    bl_workspace_size bytes into `desc`, and keeps the workspace alive for the call. The caching
    allocator orders the workspace's reuse on the same stream, so freeing it after an
    asynchronous launch is safe."""
    if device.type != "cuda":
        yield
        return
    require_backend(_lib.BL_BACKEND_CUDA)
    with torch.cuda.device(device):
        desc.stream = torch.cuda.current_stream(device).cuda_stream
        nbytes = _lib.workspace_size(desc, op, with_stats)
        workspace = None
        if nbytes > 0:
            # the backward's in compressible memory where the device has it (workspace_pool.py)
            workspace = workspace_pool.empty(nbytes, device, op == _lib.BL_OP_BACKWARD)
            desc.workspace = workspace.data_ptr()
            desc.workspace_bytes = nbytes
        yield
        del workspace


def _launch_forward(q, k, v, scale, causal, out, lse, tile_mass) -> None:
    desc = _desc(q, k, scale, causal)
    with _on_device(desc, q.device, _lib.BL_OP_FORWARD, tile_mass is not None):
        status = _lib.lib.bl_forward(ctypes.byref(desc), _view(q), _view(k), _view(v), _view(out),
                                     _ptr(lse), _ptr(tile_mass))
        _lib.check(status, "bl_forward")


def determinism_required(device: torch.device) -> bool:
    """Whether a backward on `device` runs in its deterministic form (bl_attn_desc::
    deterministic): where torch.use_deterministic_algorithms(True) is set and the device is
    CUDA. The CPU backend is deterministic in every form, so it is left as it is."""
    return device.type == "cuda" and torch.are_deterministic_algorithms_enabled()


def no_deterministic_form(reason: str) -> None:
    """A backward that torch.use_deterministic_algorithms wants deterministic and that has no
    deterministic form (`reason`: the library's): raises RuntimeError, or warns under
    warn_only=True, as PyTorch's own nondeterministic kernels do; the caller then runs the
    fastest form, whose dq may differ between calls by rounding (README, Reproducibility)."""
    what = ("BackLite's CUDA backward has no deterministic form for this call "
            f"({reason}); its fastest form sums dq by fp32 reduce-adds in the order the key "
            "tiles' CTAs finish, so dq may differ between calls by rounding")
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(f"{what}. It runs because torch.use_deterministic_algorithms(True, "
                      "warn_only=True) is set.", UserWarning, stacklevel=3)
        return
    raise RuntimeError(f"{what}, but torch.use_deterministic_algorithms(True) is set. Use "
                       "warn_only=True to run it anyway, or turn determinism off around the "
                       "backward.")


def _launch_backward(dout, q, k, v, out, lse, tile_mass, negl_prob, mask, scale, causal,
                     dq, dk, dv, deterministic=False) -> None:
    """deterministic: the caller asks for the deterministic form (as FlashAttention's
    deterministic=True) whatever torch's setting; a call without one then raises."""
    desc = _desc(q, k, scale, causal)
    uses_stats = mask is None and negl_prob > 0.0
    if not uses_stats:
        tile_mass = None  # dense or explicit mask: the tile mass is not read
    asked = deterministic and q.device.type == "cuda"  # (the CPU backend always is)
    desc.deterministic = int(asked or determinism_required(q.device))
    with _on_device(desc, q.device, _lib.BL_OP_BACKWARD, uses_stats):
        def call():
            return _lib.lib.bl_backward(
                ctypes.byref(desc), _view(q), _view(k), _view(v), _view(out), _view(dout),
                _ptr(lse), _ptr(tile_mass), ctypes.c_float(negl_prob),
                _ptr(mask),  # torch.bool is 1 byte
                _view(dq), _view(dk), _view(dv))

        status = call()
        if status == _lib.BL_ERR_NOT_DETERMINISTIC:
            # (the library refuses such a call before it writes dq, dk or dv)
            if asked:
                raise RuntimeError("BackLite: deterministic=True, but this CUDA backward has no "
                                   f"deterministic form ({_lib.last_error()})")
            no_deterministic_form(_lib.last_error())
            desc.deterministic = 0
            status = call()
        _lib.check(status, "bl_backward")


def _empty_outputs(q: torch.Tensor):
    # out: (B, Sq, Hq, D) like q, contiguous; lse: (B, Hq, Sq) fp32
    batch, seqlen_q, heads_q, head_dim = q.shape
    out = torch.empty((batch, seqlen_q, heads_q, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
    return out, lse


def _empty_tile_mass(q: torch.Tensor, k: torch.Tensor, with_stats: bool) -> torch.Tensor:
    # W: (B, Hq, Tm, Tn) fp32, or (B, Hq, 0, 0) when no statistics are recorded
    batch, seqlen_q, heads_q, _ = q.shape
    if with_stats:
        tm, tn = num_tiles(q.device, seqlen_q, k.shape[1])
    else:
        tm, tn = 0, 0
    return torch.empty((batch, heads_q, tm, tn), dtype=torch.float32, device=q.device)


# ---------------------------------------------------------------------------- forward

def run_forward(q, k, v, scale, causal, with_stats):
    """back_lite::forward's implementation (also called directly: direct_call_ok)."""
    out, lse = _empty_outputs(q)
    tile_mass = _empty_tile_mass(q, k, with_stats)
    _launch_forward(q, k, v, scale, causal, out, lse, tile_mass if with_stats else None)
    return out, lse, tile_mass


@torch.library.custom_op("back_lite::forward", mutates_args=())
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
            with_stats: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q: (B, Sq, Hq, D), k, v: (B, Sk, Hk, D) -> out (B, Sq, Hq, D), lse (B, Hq, Sq) fp32,
    W (B, Hq, Tm, Tn) fp32 (or (B, Hq, 0, 0) when with_stats is False). Not differentiable."""
    return run_forward(q, k, v, scale, causal, with_stats)


@forward.register_fake
def _forward_fake(q, k, v, scale, causal, with_stats):
    out, lse = _empty_outputs(q)
    return out, lse, _empty_tile_mass(q, k, with_stats)


@torch.library.custom_op("back_lite::forward_out", mutates_args=("out", "lse", "tile_stats"))
def forward_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                out: torch.Tensor, lse: torch.Tensor, tile_stats: Optional[torch.Tensor]) -> None:
    """Forward into caller-owned out (B, Sq, Hq, D), lse (B, Hq, Sq) and, if given,
    tile_stats (B, Hq, Tm, Tn)."""
    _launch_forward(q, k, v, scale, causal, out, lse, tile_stats)


@forward_out.register_fake
def _forward_out_fake(q, k, v, scale, causal, out, lse, tile_stats):
    return None


# ---------------------------------------------------------------------------- backward

def run_backward(dout, q, k, v, out, lse, tile_mass, negl_prob, mask, scale, causal,
                 deterministic=False):
    """back_lite::backward's implementation (also called directly: direct_call_ok)."""
    dq, dk, dv = torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)
    _launch_backward(dout, q, k, v, out, lse, tile_mass, negl_prob, mask, scale, causal,
                     dq, dk, dv, deterministic)
    return dq, dk, dv


@torch.library.custom_op("back_lite::backward", mutates_args=())
def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, tile_mass: Optional[torch.Tensor],
             negl_prob: float, mask: Optional[torch.Tensor], scale: float, causal: bool,
             deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> dq (B, Sq, Hq, D), dk, dv (B, Sk, Hk, D). Tiles: the explicit bool mask if given, else
    selection from tile_mass with negl_prob > 0, else dense. deterministic: the deterministic
    form asked for (it also runs where torch.use_deterministic_algorithms(True) is set)."""
    return run_backward(dout, q, k, v, out, lse, tile_mass, negl_prob, mask, scale, causal,
                        deterministic)


@backward.register_fake
def _backward_fake(dout, q, k, v, out, lse, tile_mass, negl_prob, mask, scale, causal,
                   deterministic=False):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


@torch.library.custom_op("back_lite::backward_out", mutates_args=("dq", "dk", "dv"))
def backward_out(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, tile_mass: Optional[torch.Tensor],
                 negl_prob: float, mask: Optional[torch.Tensor], scale: float, causal: bool,
                 dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                 deterministic: bool = False) -> None:
    """As back_lite::backward, into caller-owned dq, dk, dv (overwritten)."""
    _launch_backward(dout, q, k, v, out, lse, tile_mass, negl_prob, mask, scale, causal,
                     dq, dk, dv, deterministic)


@backward_out.register_fake
def _backward_out_fake(dout, q, k, v, out, lse, tile_mass, negl_prob, mask, scale, causal,
                       dq, dk, dv, deterministic=False):
    return None


# ---------------------------------------------------------------------------- selection

def _select_desc(tile_mass: torch.Tensor) -> BlAttnDesc:
    # tile_mass: (B, Hq, Tm, Tn); sequence lengths of exactly Tm*TM and Tn*TN give the same tiling
    batch, heads, tm, tn = tile_mass.shape
    tile_m, tile_n = _lib.tile_shape(backend_of(tile_mass.device))
    return BlAttnDesc(
        backend=backend_of(tile_mass.device), dtype=_SELECT_DTYPE, batch=batch,
        seqlen_q=tm * tile_m, seqlen_k=tn * tile_n, heads_q=heads, heads_k=heads,
        head_dim=_SELECT_HEAD_DIM, scale=1.0, causal=0, stream=None, workspace=None,
        workspace_bytes=0)


@torch.library.custom_op("back_lite::select_tiles", mutates_args=())
def select_tiles(tile_mass: torch.Tensor, negl_prob: float) -> torch.Tensor:
    """tile_mass: (B, Hq, Tm, Tn) fp32 contiguous -> mask (B, Hq, Tm, Tn) torch.bool (True = kept)."""
    mask = torch.empty(tile_mass.shape, dtype=torch.bool, device=tile_mass.device)
    desc = _select_desc(tile_mass)
    if tile_mass.device.type == "cuda":
        require_backend(_lib.BL_BACKEND_CUDA)
        with torch.cuda.device(tile_mass.device):
            desc.stream = torch.cuda.current_stream(tile_mass.device).cuda_stream
            status = _lib.lib.bl_select_tiles(ctypes.byref(desc), tile_mass.data_ptr(),
                                              ctypes.c_float(negl_prob), mask.data_ptr())
    else:
        status = _lib.lib.bl_select_tiles(ctypes.byref(desc), tile_mass.data_ptr(),
                                          ctypes.c_float(negl_prob), mask.data_ptr())
    _lib.check(status, "bl_select_tiles")
    return mask


@select_tiles.register_fake
def _select_tiles_fake(tile_mass, negl_prob):
    return torch.empty(tile_mass.shape, dtype=torch.bool, device=tile_mass.device)


# ---------------------------------------------------------------------------- autograd

@torch.library.custom_op("back_lite::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
              negl_prob: float, with_stats: bool,
              deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Differentiable attention: (out, lse, W). W is recorded when with_stats is True (it must
    be when negl_prob > 0); lse and W carry no gradient. deterministic: the backward's
    deterministic form asked for (back_lite::backward)."""
    return run_forward(q, k, v, scale, causal, with_stats)


@attention.register_fake
def _attention_fake(q, k, v, scale, causal, negl_prob, with_stats, deterministic=False):
    out, lse = _empty_outputs(q)
    return out, lse, _empty_tile_mass(q, k, with_stats)


def _attention_setup_context(ctx, inputs, output):
    q, k, v, scale, causal, negl_prob, with_stats, *deterministic = inputs  # (default: absent)
    out, lse, tile_mass = output
    ctx.save_for_backward(q, k, v, out, lse, tile_mass)
    ctx.scale = scale
    ctx.causal = causal
    ctx.negl_prob = negl_prob
    ctx.deterministic = bool(deterministic and deterministic[0])
    ctx.mark_non_differentiable(lse, tile_mass)


def _backward_of_saved(ctx, dout):
    """(dq, dk, dv) from an attention call's saved tensors (both autograd paths below)."""
    q, k, v, out, lse, tile_mass = ctx.saved_tensors
    if dout.stride(-1) != 1 or any(n > 1 and s == 0 for n, s in zip(dout.shape, dout.stride())):
        # The C API needs the head dim contiguous and no stride-0 dims; autograd can hand over
        # any layout (e.g. the expanded gradient of out.sum()), so such a dout is copied once.
        dout = dout.contiguous()
    sparse = ctx.negl_prob > 0.0
    args = (dout, q, k, v, out, lse, tile_mass if sparse else None, ctx.negl_prob, None,
            ctx.scale, ctx.causal, ctx.deterministic)
    # an eager backward (autograd runs it without grad mode) skips the op's dispatch
    run = run_backward if direct_call_ok(dout, q, k, v, out, lse, tile_mass) \
        else torch.ops.back_lite.backward
    return run(*args)


def _attention_backward(ctx, dout, _dlse, _dtile_mass):
    dq, dk, dv = _backward_of_saved(ctx, dout)
    return dq, dk, dv, None, None, None, None, None


attention.register_autograd(_attention_backward, setup_context=_attention_setup_context)


class EagerAttention(torch.autograd.Function):
    """back_lite::attention's forward and backward as a plain autograd.Function, for eager calls
    (eager_attention_ok): the op's autograd goes through the dispatcher and torch.library's
    autograd wrapper on both passes. Host time of a forward + backward: -31..-42 us on the
    development machine's CPU (tiny CPU tensors, torch 2.13, of ~90-130); on the H200 machine
    (torch 2.11) lower in 6 of 6 pairs by 2-275 us of ~550-1050, a host noisier than the gain,
    and small host-bound calls (4 x 4096 x 16 x 64 causal) 5-24 us a step faster
    (bench/results/host-s94-eager-attention.txt). Same outputs, saved tensors and backward
    (_backward_of_saved); lse and W carry no gradient, and no zero gradients are made for them
    (set_materialize_grads(False)). torch.compile, modes, subclasses and torch.func keep the op."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, negl_prob, with_stats, deterministic):
        outputs = run_forward(q, k, v, scale, causal, with_stats)
        _attention_setup_context(ctx, (q, k, v, scale, causal, negl_prob, with_stats,
                                       deterministic), outputs)
        ctx.set_materialize_grads(False)
        return outputs

    @staticmethod
    @torch.autograd.function.once_differentiable  # a second derivative raises, as the op's
    def backward(ctx, dout, _dlse, _dtile_mass):
        dq, dk, dv = _backward_of_saved(ctx, dout)
        return dq, dk, dv, None, None, None, None, None


def eager_attention_ok(*tensors: torch.Tensor) -> bool:
    """True where back_lite.attention may use EagerAttention instead of the op: as
    direct_call_ok, except that the inputs may record autograd (that is the point)."""
    return _untraced() and all(type(t) is torch.Tensor for t in tensors)
