"""Ring attention (context parallelism) on BackLite's exact forward and block-sparse backward.

Every rank of a process group holds a shard of the sequence: q (B, Sq_local, Hq, D) and k, v
(B, Sk_local, Hk, D), laid out as back_lite.distributed.sharding describes ("contiguous", or
"zigzag" for causal load balance). The k/v shards travel once around the ring (P steps, rank r
holds the shard of rank r - t at step t); every step is one call of the library's forward or
backward on the pair (local q, visiting k/v).

Forward: the partial results (out_t, lse_t) are merged with the standard log-sum-exp rule into
the global out and lse of the local rows. Backward: each step runs the library backward with the
GLOBAL out and lse (so its P is the global softmax restricted to the visiting keys), adds dq into
a local fp32 accumulator and adds dk/dv into fp32 accumulators that travel with the k/v; one
extra hop after the last step brings every accumulator home.

Tile selection (negl_prob > 0). The global selection needs, for every local row tile, the tile
mass W of the whole row normalized by the GLOBAL row lse; the library's W of a call is normalized
by that call's own lse_c. Per row i the exact factor is f_i = exp(lse_c,i - lse_i) (the share of
row i's global mass that falls in the call's keys), but W has already summed 64 rows, so exact
renormalization from W is impossible in general. We rescale each call's row tile m by

    F_m = sum_{i in m} f_i / sum_n W_c[m, n]

which gives the row tile exactly its true share of the global mass in the call's keys (row tile
totals are exact); only how that share spreads over the call's key tiles is a guess (it is exact
when the f_i of the row tile are equal, or when the call covers one key tile). So the forward
with statistics makes one call per visiting key chunk ("chunk" split, default: the guess stays
inside one contiguous chunk) or, with exact_stats, one call per visiting key tile ("tile" split:
exact, more and smaller calls). The rescaled pieces are placed into a (B, Hq, Tm_local,
Tn_global) W in global key order, the selection runs once per row tile over the whole row
(back_lite.functional.select), and each backward step gets its slice of that mask through the
explicit-mask backward. docs/distributed.md gives the measured effect of the default.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from .. import _checks, functional
from . import sharding
from ._ring_comm import TAG_DKV, TAG_KV, RingExchange


class RingForward(NamedTuple):
    """What ring_forward returns for the local rows."""
    out: torch.Tensor        # (B, Sq_local, Hq, D), dtype of q
    lse: torch.Tensor        # (B, Hq, Sq_local) fp32: the GLOBAL row lse
    tile_mass: torch.Tensor  # (B, Hq, Tm_local, Tn_global) fp32, or (B, Hq, 0, 0) without stats


@dataclass(frozen=True)
class _Step:
    """One ring step's library call: local q rows [q0, q1) against keys [k0, k1) of the
    visiting shard, with or without the (diagonal) causal mask."""
    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool


class _RingPlan:
    """Which part of the visiting shard each local row sees, and where its tiles sit globally."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, group, causal: bool,
                 layout: Optional[str], tiled: bool):
        # q: (B, Sq_local, Hq, D), k: (B, Sk_local, Hk, D)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.layout = sharding.check_layout(
            sharding.default_layout(causal) if layout is None else layout)
        self.causal = causal
        self.seqlen_q, self.seqlen_k = q.shape[1], k.shape[1]
        per_rank = sharding.chunks_per_rank(self.layout)
        if causal and self.seqlen_q != self.seqlen_k:
            raise ValueError(f"BackLite: causal ring attention needs q and k sharded alike, but "
                             f"q has {self.seqlen_q} local tokens and k has {self.seqlen_k}")
        for name, n in (("q", self.seqlen_q), ("k", self.seqlen_k)):
            if n % per_rank != 0:
                raise ValueError(f"BackLite: layout {self.layout!r} splits each shard into "
                                 f"{per_rank} chunks, but {name} has {n} local tokens")
        self.chunk_q = self.seqlen_q // per_rank
        self.chunk_k = self.seqlen_k // per_rank
        self.tile_m, self.tile_n = functional.tile_shape(q.device)
        self.num_rows = -(-self.seqlen_q // self.tile_m)
        self.num_cols = 0
        self.device = q.device
        self._columns = {}  # (owner, k0, k1) -> device index tensor, built once per ring
        if tiled:
            # The global row of tile mass is assembled from whole key tiles of every chunk, and
            # (zigzag) each q chunk starts on a row tile boundary.
            if self.chunk_k % self.tile_n != 0:
                raise ValueError(
                    f"BackLite: ring attention with a sparse backward needs every key chunk to be "
                    f"whole key tiles: k has {self.seqlen_k} local tokens = {per_rank} chunk(s) of "
                    f"{self.chunk_k} ({self.layout!r}), not a multiple of TN={self.tile_n}")
            if per_rank > 1 and self.chunk_q % self.tile_m != 0:
                raise ValueError(
                    f"BackLite: zigzag ring attention with a sparse backward needs every query "
                    f"chunk to be whole row tiles: q has {self.seqlen_q} local tokens = 2 chunks "
                    f"of {self.chunk_q}, not a multiple of TM={self.tile_m}")
            if self.tile_n % self.tile_m != 0:
                # per-key-tile calls split diagonal blocks at key tile boundaries, which must
                # then be row tile boundaries too
                raise ValueError(f"BackLite: ring attention needs TN={self.tile_n} to be a "
                                 f"multiple of TM={self.tile_m}")
            self.num_cols = self.world_size * self.seqlen_k // self.tile_n

    def step(self, owner: int) -> Optional[_Step]:
        """The call for the shard of rank `owner`, or None when no local row sees any of it."""
        full = _Step(0, self.seqlen_q, 0, self.seqlen_k, False)
        if not self.causal:
            return full
        if owner == self.rank:
            # Same shards on both sides: the local causal mask is the global one restricted to
            # them (zigzag: chunk r sees itself causally; chunk 2P-1-r sees chunk r fully and
            # itself causally -- exactly a square causal mask over the concatenation).
            return _Step(0, self.seqlen_q, 0, self.seqlen_k, True)
        if self.layout == "contiguous":
            return full if owner < self.rank else None
        if owner < self.rank:
            # Visiting chunks (owner, 2P-1-owner): both local chunks are later than `owner` and
            # earlier than 2P-1-owner.
            return _Step(0, self.seqlen_q, 0, self.chunk_k, False)
        # owner > rank: only the late local chunk 2P-1-rank sees the visitor, and it sees both
        # of its chunks.
        return _Step(self.chunk_q, self.seqlen_q, 0, self.seqlen_k, False)

    def calls(self, owner: int, split: str) -> list[_Step]:
        """The library calls for the shard of rank `owner` (none when no local row sees it).

        split "step": the one call of step(). "chunk": one call per visiting key chunk (and per
        diagonal block), so that every call's W covers a single key chunk and the rescaling
        (module docstring) only has to guess how the mass spreads inside a chunk, not between
        chunks that may lie far apart in the sequence; same math, a few more calls. "tile": one
        call per visiting key tile, which makes the rescaled W exact (a call's W then has one
        column, whose true global mass is the sum of the rows' exact factors), at the price of
        many small calls and merges."""
        coarse = self.step(owner)
        if coarse is None:
            return []
        if split == "step":
            return [coarse]
        calls = self._chunk_calls(owner, coarse)
        if split == "chunk":
            return calls
        return [piece for call in calls for piece in self._tile_calls(call)]

    def _chunk_calls(self, owner: int, coarse: _Step) -> list[_Step]:
        if self.layout == "contiguous":
            return [coarse]  # one key chunk per shard already
        q_chunks = sharding.chunk_ids(self.rank, self.world_size, self.layout)
        k_chunks = sharding.chunk_ids(owner, self.world_size, self.layout)
        calls = []
        for kb, k_chunk in enumerate(k_chunks):
            k0, k1 = kb * self.chunk_k, (kb + 1) * self.chunk_k
            run = None  # [q0, q1) of consecutive local q chunks that see all of this key chunk
            for qa, q_chunk in enumerate(q_chunks):
                q0, q1 = qa * self.chunk_q, (qa + 1) * self.chunk_q
                if not self.causal or k_chunk < q_chunk:
                    run = (run[0], q1) if run is not None else (q0, q1)
                    continue
                if run is not None:
                    calls.append(_Step(run[0], run[1], k0, k1, False))
                    run = None
                if self.causal and k_chunk == q_chunk:
                    calls.append(_Step(q0, q1, k0, k1, True))  # square diagonal block
            if run is not None:
                calls.append(_Step(run[0], run[1], k0, k1, False))
        return calls

    def _tile_calls(self, call: _Step) -> list[_Step]:
        pieces = []
        for k0 in range(call.k0, call.k1, self.tile_n):
            k1 = min(k0 + self.tile_n, call.k1)
            if not call.causal:
                pieces.append(_Step(call.q0, call.q1, k0, k1, False))
                continue
            # Square diagonal block: its row q0 + x sees its key k0 + y iff y <= x. The rows
            # level with this key tile see it causally, the rows below see all of it, the rows
            # above none of it.
            d0 = call.q0 + (k0 - call.k0)
            d1 = d0 + (k1 - k0)
            pieces.append(_Step(d0, d1, k0, k1, True))
            if d1 < call.q1:
                pieces.append(_Step(d1, call.q1, k0, k1, False))
        return pieces

    def rows(self, step: _Step) -> tuple[int, int]:
        """Local row tiles [r0, r1) covered by a step."""
        return step.q0 // self.tile_m, -(-step.q1 // self.tile_m)

    def columns(self, owner: int, step: _Step) -> torch.Tensor:
        """int64 (Tn_step,): the global key tile of every key tile of the step."""
        key = (owner, step.k0, step.k1)
        if key not in self._columns:
            chunks = sharding.chunk_ids(owner, self.world_size, self.layout)
            cols = []
            for local in range(step.k0, step.k1, self.tile_n):
                chunk, within = divmod(local, self.chunk_k)
                cols.append((chunks[chunk] * self.chunk_k + within) // self.tile_n)
            self._columns[key] = torch.tensor(cols, dtype=torch.int64, device=self.device)
        return self._columns[key]


def _resolve_group(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("BackLite: ring attention needs an initialized torch.distributed "
                           "process group (torch.distributed.init_process_group)")
    return group if group is not None else dist.group.WORLD


def _merge(out_acc: torch.Tensor, lse_acc: torch.Tensor, out: torch.Tensor,
           lse: torch.Tensor) -> None:
    """Log-sum-exp merge of one partial result into the running one, in place.
    out_acc: (B, L, H, D) fp32 and lse_acc: (B, H, L) fp32 (views of the accumulators);
    out: (B, L, H, D), lse: (B, H, L) of the partial result."""
    lse_new = torch.logaddexp(lse_acc, lse)
    # Rows that have seen no allowed key yet keep lse = -inf and out = 0 (exp(-inf - 0) = 0).
    base = lse_new.masked_fill(torch.isneginf(lse_new), 0.0)
    keep = torch.exp(lse_acc - base).transpose(1, 2).unsqueeze(-1)
    add = torch.exp(lse - base).transpose(1, 2).unsqueeze(-1)
    out_acc.mul_(keep).add_(out.float() * add)
    lse_acc.copy_(lse_new)


def _row_tile_sums(x: torch.Tensor, tile_m: int) -> torch.Tensor:
    """x: (B, H, L) -> (B, H, ceil(L / tile_m)) sums over consecutive runs of tile_m rows."""
    pad = (-x.shape[-1]) % tile_m
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.unflatten(-1, (-1, tile_m)).sum(-1)


def _global_tile_mass(plan: _RingPlan, pieces, lse: torch.Tensor) -> torch.Tensor:
    """Assembles the (B, Hq, Tm_local, Tn_global) tile mass normalized by the global lse from the
    per-step W (each normalized by its own lse_t); see the module docstring for the rescaling."""
    batch, heads, _ = lse.shape
    tile_mass = torch.zeros((batch, heads, plan.num_rows, plan.num_cols), dtype=torch.float32,
                            device=lse.device)
    for owner, step, step_lse, step_mass in pieces:
        # step_lse: (B, Hq, q1 - q0), step_mass: (B, Hq, r1 - r0, Tn_step)
        share = torch.exp(step_lse.double() - lse[:, :, step.q0:step.q1].double())
        share = share.masked_fill(torch.isneginf(step_lse), 0.0)  # rows that saw no key here
        true_total = _row_tile_sums(share, plan.tile_m)
        step_total = step_mass.double().sum(-1)
        # NaN totals (NaN inputs) stay NaN so that the selection keeps every tile of that row.
        factor = (true_total / step_total).masked_fill(step_total == 0, 0.0)
        r0, r1 = plan.rows(step)
        tile_mass[:, :, r0:r1].index_copy_(
            3, plan.columns(owner, step), (step_mass.double() * factor[..., None]).float())
    return tile_mass


def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None,
                 scale: Optional[float] = None, causal: bool = False,
                 layout: Optional[str] = None, with_stats: bool = False,
                 exact_stats: bool = False) -> RingForward:
    """Exact forward of attention over the whole sharded sequence, no autograd.

    q: (B, Sq_local, Hq, D), k, v: (B, Sk_local, Hk, D): this rank's shards in `layout`
    ("zigzag" by default when causal, else "contiguous"); every rank passes the same shapes.
    Returns RingForward(out, lse, tile_mass) for the local rows: lse is the global row lse;
    tile_mass (with_stats) is the whole-row tile mass, columns in global key order, normalized
    by the global lse: approximately by default, exactly with exact_stats (one library call per
    visiting key tile instead of one per key chunk; see the module docstring).
    """
    group = _resolve_group(group)
    _checks.qkv(q, k, v)
    scale = _checks.scale(scale, q.shape[-1])
    causal = _checks.causal(causal)
    with_stats = bool(with_stats) or bool(exact_stats)
    plan = _RingPlan(q, k, group, causal, layout, tiled=with_stats)
    split = ("tile" if exact_stats else "chunk") if with_stats else "step"
    exchange = RingExchange(group)
    batch, seqlen_q, heads_q, _ = q.shape
    out_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse_acc = torch.full((batch, heads_q, seqlen_q), float("-inf"), dtype=torch.float32,
                         device=q.device)
    pieces = []
    k_cur, v_cur = k, v
    for t in range(plan.world_size):
        owner = (plan.rank - t) % plan.world_size
        # Send the shard on while this step computes with it.
        pending = exchange.start([k_cur, v_cur], TAG_KV) if t + 1 < plan.world_size else None
        for call in plan.calls(owner, split):
            out_t, lse_t, mass_t = functional.forward(
                q[:, call.q0:call.q1], k_cur[:, call.k0:call.k1], v_cur[:, call.k0:call.k1],
                scale=scale, causal=call.causal, with_stats=with_stats)
            _merge(out_acc[:, call.q0:call.q1], lse_acc[:, :, call.q0:call.q1], out_t, lse_t)
            if with_stats:
                pieces.append((owner, call, lse_t, mass_t))
        if pending is not None:
            k_cur, v_cur = pending.wait()
    if with_stats:
        tile_mass = _global_tile_mass(plan, pieces, lse_acc)
    else:
        tile_mass = torch.empty((batch, heads_q, 0, 0), dtype=torch.float32, device=q.device)
    return RingForward(out_acc.to(q.dtype), lse_acc, tile_mass)


def ring_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, group=None,
                  mask: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                  causal: bool = False, layout: Optional[str] = None):
    """Backward of ring attention, no autograd. Returns (dq, dk, dv) for the local shards.

    dout, out: (B, Sq_local, Hq, D); lse: (B, Hq, Sq_local) fp32 -- the GLOBAL out and lse from
    ring_forward. mask: None for the dense backward, or the (B, Hq, Tm_local, Tn_global) bool
    mask of kept tiles (columns in global key order, as ring_forward's tile_mass), e.g.
    back_lite.functional.select(tile_mass, negl_prob). dq, dk, dv are accumulated in fp32
    (dk/dv travel around the ring with their k/v) and returned in the input dtypes.
    """
    group = _resolve_group(group)
    _checks.qkv(q, k, v)
    scale = _checks.scale(scale, q.shape[-1])
    causal = _checks.causal(causal)
    _checks.like("dout", dout, q, "q")
    _checks.like("out", out, q, "q")
    _checks.lse(lse, q)
    plan = _RingPlan(q, k, group, causal, layout, tiled=mask is not None)
    if mask is not None:
        _checks.tensor("mask", mask)
        expected = (q.shape[0], q.shape[2], plan.num_rows, plan.num_cols)
        if mask.dtype != torch.bool or tuple(mask.shape) != expected:
            raise ValueError(f"BackLite: mask must be torch.bool of shape (B, Hq, Tm_local, "
                             f"Tn_global) = {expected}, got {mask.dtype} {tuple(mask.shape)}")
    exchange = RingExchange(group)
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse_rows = {}  # (q0, q1) -> contiguous lse slice (the library wants lse contiguous)
    k_cur, v_cur = k, v
    dkv_pending = None
    for t in range(plan.world_size):
        owner = (plan.rank - t) % plan.world_size
        kv_pending = exchange.start([k_cur, v_cur], TAG_KV) if t + 1 < plan.world_size else None
        dk_step = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv_step = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        step = plan.step(owner)
        if step is not None:
            step_mask = None
            if mask is not None:
                r0, r1 = plan.rows(step)
                step_mask = mask[:, :, r0:r1].index_select(3, plan.columns(owner, step))
            if step_mask is None or bool(step_mask.any()):
                rows = (step.q0, step.q1)
                if rows not in lse_rows:
                    lse_rows[rows] = lse[:, :, step.q0:step.q1].contiguous()
                q_rows = slice(step.q0, step.q1)
                keys = slice(step.k0, step.k1)
                dq_t, dk_t, dv_t = functional.backward(
                    dout[:, q_rows], q[:, q_rows], k_cur[:, keys], v_cur[:, keys],
                    out[:, q_rows], lse_rows[rows], mask=step_mask, scale=scale,
                    causal=step.causal)
                dq_acc[:, q_rows] += dq_t.float()
                dk_step[:, keys] += dk_t.float()
                dv_step[:, keys] += dv_t.float()
        if dkv_pending is not None:
            # The accumulators of the visiting shard, from the ranks it visited before.
            dk_in, dv_in = dkv_pending.wait()
            dk_step += dk_in
            dv_step += dv_in
        # After the last step this hop brings each accumulator back to its shard's owner.
        dkv_pending = exchange.start([dk_step, dv_step], TAG_DKV)
        if kv_pending is not None:
            k_cur, v_cur = kv_pending.wait()
    dk_acc, dv_acc = dkv_pending.wait()
    return dq_acc.to(q.dtype), dk_acc.to(k.dtype), dv_acc.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, negl_prob, scale, causal, layout, exact_stats):
        sparse = negl_prob > 0.0
        result = ring_forward(q, k, v, group, scale=scale, causal=causal, layout=layout,
                              with_stats=sparse, exact_stats=sparse and exact_stats)
        # Selection needs only the forward's statistics: do it now and keep the compact mask
        # (one byte per tile) instead of the fp32 tile mass.
        mask = functional.select(result.tile_mass, negl_prob) if sparse else None
        ctx.save_for_backward(q, k, v, result.out, result.lse, mask)
        ctx.group, ctx.scale, ctx.causal, ctx.layout = group, scale, causal, layout
        ctx.mark_non_differentiable(result.lse)
        return result.out, result.lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, mask = ctx.saved_tensors
        # The library needs D contiguous and no stride-0 dims; autograd may hand over either.
        dq, dk, dv = ring_backward(dout.contiguous(), q, k, v, out, lse, ctx.group, mask=mask,
                                   scale=ctx.scale, causal=ctx.causal, layout=ctx.layout)
        return dq, dk, dv, None, None, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None,
                   negl_prob: float = 0.0, scale: Optional[float] = None, causal: bool = False,
                   layout: Optional[str] = None, exact_stats: bool = False,
                   return_lse: bool = False):
    """Differentiable context-parallel attention over the sequence sharded across `group`.

    q: (B, Sq_local, Hq, D), k, v: (B, Sk_local, Hk, D): this rank's shards, laid out as
    `layout` ("zigzag" by default when causal: rank r holds chunks r and 2P-1-r of 2P; else
    "contiguous"); see back_lite.distributed.shard. Returns out (B, Sq_local, Hq, D), or
    (out, lse) with the global lse (B, Hq, Sq_local) fp32. The backward skips, per row tile, the
    key tiles (of the whole row, across all ranks) carrying < negl_prob of its mass. The mass is
    normalized by the global lse approximately (default) or, with exact_stats, exactly -- then
    the kept tiles are those of a single-device run -- at the cost of one forward call per
    visiting key tile.
    """
    _checks.qkv(q, k, v)
    scale = _checks.scale(scale, q.shape[-1])
    negl_prob = _checks.negl_prob(negl_prob)
    out, lse = _RingAttention.apply(q, k, v, _resolve_group(group), negl_prob, scale,
                                    _checks.causal(causal), layout, bool(exact_stats))
    return (out, lse) if return_lse else out
