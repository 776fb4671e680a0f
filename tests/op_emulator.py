"""Float32 emulations of ``torch.ops.flash_attn_hopper.fwd`` and ``bwd``'s contracts (and of the
variable-length ``varlen_fwd`` / ``varlen_bwd``: each sequence through the dense emulation, see
:func:`emulated_varlen_ops`), and ways to install them.

The CPU tests of the SDPA drop-in, torch's registry route and the
transformers integration run their fast paths through this emulation, so
that what they check -- the layouts, scales, masks and alignment each layer
passes to the op -- is checked on any machine.  The contract (from
csrc/flash_api.cpp): q (b, sq, hq, d), k and v (b, sk, hk, d); query i sees
key j when  j >= i + off - left (left >= 0)  and  j <= i + off + right
(right >= 0, and right = 0 when causal), off = sk - sq, or 0 with top_left;
rows that see no key give out = 0 and lse = -inf; softcap > 0 caps the scaled scores s to
softcap * tanh(s / softcap) before the mask; a sink (float32, one logit per query head) joins
every row's denominator: lse' = logaddexp(lse, sink), out' = out * exp(lse - lse').  out is a contiguous
(b, sq, hq, d) tensor in q's dtype, lse float32 (b, hq, sq).

``bwd`` (flash_attn_hopper/ops.py's BWD_SCHEMA) recomputes P from q, k and
the forward's lse, takes D = rowsum(dout * out) from the forward's output, and
returns contiguous dq like q, dk and dv like k and v, dk/dv summed over the
query heads of each group, and with a sink its gradient -sum_rows exp(sink - lse) * D
(float32 (hq,); an empty tensor without): the kernel's maths, so that wrong tensors or
arguments handed to it show up as wrong gradients.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from flash_attn_hopper import manifest, ops, packgqa


def op_mask(seqlen_q, seqlen_k, causal, left, right, top_left, device=None) -> torch.Tensor:
    """(seqlen_q, seqlen_k) bool, True where the op masks the key out."""
    if causal:
        right = 0
    offset = 0 if top_left else seqlen_k - seqlen_q
    row = torch.arange(seqlen_q, device=device).view(-1, 1) + offset
    col = torch.arange(seqlen_k, device=device).view(1, -1)
    masked = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        masked = masked | (col > row + right)
    if left >= 0:
        masked = masked | (col < row - left)
    return masked


def capped(scores, softcap):
    """The op's scores after softcap (0 = off)."""
    return torch.tanh(scores / softcap) * softcap if softcap else scores


def emulate_fwd(q, k, v, softmax_scale, causal, window_size_left=-1, window_size_right=-1, top_left=False,
                softcap=0.0, sink=None, num_splits=1):
    """What the op returns, computed in float32 with plain torch ops (also on fake tensors);
    num_splits changes nothing but rounding in the kernels, and nothing here."""
    assert num_splits >= 0, num_splits
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.size(1), k.size(2)
    group = heads_q // heads_kv
    kf = k.float().repeat_interleave(group, dim=2)
    vf = v.float().repeat_interleave(group, dim=2)
    scores = capped(torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * softmax_scale, softcap)
    masked = op_mask(seqlen_q, seqlen_k, causal, window_size_left, window_size_right, top_left, device=q.device)
    scores = scores.masked_fill(masked, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1).masked_fill(masked.all(dim=-1, keepdim=True), 0.0)
    if sink is not None:
        assert sink.dtype == torch.float32 and sink.shape == (heads_q,), (sink.dtype, sink.shape)
        with_sink = torch.logaddexp(lse, sink.view(1, -1, 1))
        probs = probs * torch.exp(lse - with_sink)[..., None]  # 0 where lse is -inf
        lse = with_sink
    out = torch.einsum("bhqk,bkhd->bqhd", probs, vf).to(q.dtype).contiguous()
    return out, lse.contiguous()


def emulate_bwd(
    dout, q, k, v, out, softmax_lse, softmax_scale, causal,
    window_size_left=-1, window_size_right=-1, top_left=False, deterministic=False, softcap=0.0, sink=None,
):
    """(dq, dk, dv, dsink) of the attention that produced ``out`` and ``softmax_lse``, in float32 maths."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.size(1), k.size(2)
    group = heads_q // heads_kv
    qf, dof = q.float(), dout.float()
    kf = k.float().repeat_interleave(group, dim=2)
    vf = v.float().repeat_interleave(group, dim=2)
    raw = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * softmax_scale
    scores = capped(raw, softcap)
    masked = op_mask(seqlen_q, seqlen_k, causal, window_size_left, window_size_right, top_left, device=q.device)
    probs = torch.exp(scores - softmax_lse.float()[..., None]).masked_fill(masked, 0.0)
    dv = torch.einsum("bhqk,bqhd->bkhd", probs, dof)
    dprobs = torch.einsum("bqhd,bkhd->bhqk", dof, vf)
    rowsum = (dof * out.float()).sum(-1).transpose(1, 2)[..., None]  # (b, hq, sq, 1)
    dscores = probs * (dprobs - rowsum)
    if softcap:  # d(softcap tanh(raw / softcap)) / d raw = 1 - tanh^2
        dscores = dscores * (1 - torch.tanh(raw / softcap) ** 2)
    dq = torch.einsum("bhqk,bkhd->bqhd", dscores, kf) * softmax_scale
    dk = torch.einsum("bhqk,bqhd->bkhd", dscores, qf) * softmax_scale
    # Query head h reads kv head h // group: its gradients go back there.
    dk = dk.reshape(batch, seqlen_k, heads_kv, group, head_dim).sum(3)
    dv = dv.reshape(batch, seqlen_k, heads_kv, group, v.shape[-1]).sum(3)
    return (dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous(),
            emulate_dsink(rowsum[..., 0], softmax_lse.float(), sink, (0, 2)))


def emulate_dsink(rowsum, lse, sink, row_dims):
    """The bwd ops' dsink: -sum over rows of exp(sink - lse) * rowsum (heads on the dim not in
    ``row_dims``), 0 where lse is -inf; an empty float32 tensor without a sink."""
    if sink is None:
        return torch.empty(0, dtype=torch.float32, device=lse.device)
    assert sink.dtype == torch.float32 and sink.dim() == 1, (sink.dtype, sink.shape)
    shape = [1] * lse.dim()
    shape[next(i for i in range(lse.dim()) if i not in row_dims)] = -1
    p_sink = torch.exp(sink.view(shape) - lse).masked_fill(lse == float("-inf"), 0.0)
    return -(p_sink * rowsum).sum(row_dims)


def check_bwd_head_dims(call: dict) -> None:
    """The binding's rule (csrc/api/checks.h): q and k share a head dim; v, out and dout share
    theirs, q's or a pair the kernels take (manifest.own_value_kernels, as the forward)."""
    d, dk = call["q"].shape[-1], call["k"].shape[-1]
    dv = {call[n].shape[-1] for n in ("v", "out", "dout")}
    assert d == dk and len(dv) == 1, f"q / k and v / out / dout head dims: {d}, {dk}, {dv}"
    (dv,) = dv
    assert dv == d or manifest.own_value_kernels(d, dv), f"no backward kernels take head dims {d} / {dv}"


class EmulatedKernel:
    """Counts and records the op calls that reached the emulation."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.softcaps: list[float] = []  # each call's softcap and sink (kept out of calls: tests compare those whole)
        self.sinks: list = []
        self.splits: list[int] = []

    def __call__(self, q, k, v, softmax_scale, causal, window_size_left=-1, window_size_right=-1, top_left=False,
                 softcap=0.0, sink=None, num_splits=1):
        # The binding's rule: v's head dim is q's, or one the forward has kernels of its own for.
        assert v.shape[-1] == q.shape[-1] or manifest.own_value_kernels(q.shape[-1], v.shape[-1]), (q.shape, v.shape)
        self.calls.append((q, k, v, softmax_scale, causal, window_size_left, window_size_right, top_left))
        self.softcaps.append(softcap)
        self.sinks.append(sink)
        self.splits.append(num_splits)
        return emulate_fwd(q, k, v, softmax_scale, causal, window_size_left, window_size_right, top_left, softcap,
                           sink)


@contextlib.contextmanager
def emulated_op(monkeypatch: pytest.MonkeyPatch, device_type: str = "cpu"):
    """Make the op run the emulation on ``device_type`` tensors and let the routing accept that device.

    With the compiled extension the emulation becomes the op's kernel for that
    dispatch key, so calls go through the real schema (argument names, defaults,
    the fake kernel under torch.compile).  Without it, ``torch.ops.flash_attn_hopper.fwd``
    itself is replaced by the emulation.
    """
    from flash_attn_hopper import _build_info, support

    kernel = EmulatedKernel()
    monkeypatch.setattr(support, "device_refusal", lambda q, k, v, names=None: None)
    monkeypatch.setattr(_build_info, "COMPILED", None)  # the emulation covers every head dim and dtype
    if ops.extension_loaded():
        library = torch.library.Library("flash_attn_hopper", "IMPL")

        def cpu_kernel(*args, **kwargs):
            return kernel(*args, **kwargs)

        library.impl("fwd", cpu_kernel, device_type.upper())
        try:
            yield kernel
        finally:
            library._destroy()
    else:
        monkeypatch.setattr(torch.ops.flash_attn_hopper, "fwd", kernel, raising=False)
        yield kernel


class EmulatedBackward:
    """Records the bwd calls that reached the emulation (every argument, by name)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, *args, **kwargs):
        # The dispatcher leaves trailing arguments that equal their defaults out of a Python kernel's call.
        schema = torch._C.parse_schema(f"flash_attn_hopper::{ops.BWD_SCHEMA}")
        call = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
        call.update(zip(ops.BWD_SCHEMA_ARGS, args), **kwargs)
        self.calls.append(call)
        check_bwd_head_dims(call)
        return emulate_bwd(**call)


@contextlib.contextmanager
def emulated_bwd_op(device_type: str = "cpu", schema: str | None = None):
    """Give ``torch.ops.flash_attn_hopper.bwd`` the emulation as its kernel for ``device_type``.

    With a build that has the bwd op, the emulation is added as that op's
    kernel for the device (the real schema and fake kernel stay).  Without
    one, a stand-in op is defined with ``schema`` (default ops.BWD_SCHEMA, the
    contract csrc/flash_api.cpp implements) and ops.py's fake kernel, and
    removed again afterwards.  Needs the compiled extension (the forward's
    autograd formula is registered only with it).
    """
    kernel = EmulatedBackward()
    if ops.has_bwd_op():
        if schema is not None:
            pytest.skip("this build defines the real bwd op; no stand-in with another schema can replace it")
        library = torch.library.Library("flash_attn_hopper", "IMPL")
        library.impl("bwd", kernel, device_type.upper())
    else:
        library = torch.library.Library("flash_attn_hopper", "FRAGMENT")
        library.define(schema or ops.BWD_SCHEMA)
        library.impl("bwd", kernel, device_type.upper())
        ops.register_bwd_fake(lib=library)
    try:
        yield kernel
    finally:
        library._destroy()


@contextlib.contextmanager
def emulated_kernels(monkeypatch: pytest.MonkeyPatch):
    """Forward and backward emulations on CPU, reachable through flash_attn_func (the routing
    accepts CPU tensors and every head dim and dtype); yields the (fwd, bwd) recorders."""
    from flash_attn_hopper import _build_info, support

    monkeypatch.setattr(support, "device_refusal", lambda q, k, v, names=None: None)
    monkeypatch.setattr(_build_info, "COMPILED", None)
    with emulated_op(monkeypatch) as fwd, emulated_bwd_op() as bwd:
        yield fwd, bwd


# --------------------------------------------------------------------------
# The variable-length ops (ops.VARLEN_FWD_SCHEMA / VARLEN_BWD_SCHEMA)
# --------------------------------------------------------------------------


def varlen_segments(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, total_q, total_k):
    """[(q_start, q_len, k_start, k_len)] per sequence, as the contract defines them.

    Strict where the kernels clamp: a malformed call (offsets out of order or out of range,
    lengths over max_seqlen, cu_seqlens_q[-1] != total_q without seqused_q) raises
    AssertionError, so a Python layer that builds such a call fails its CPU test. seqused_k is
    the keys' length from cu_seqlens_k[b] (FA3's rule; those offsets may then come in any order),
    seqused_q a length within the query segment.
    """
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    uq = None if seqused_q is None else seqused_q.tolist()
    uk = None if seqused_k is None else seqused_k.tolist()
    assert len(cq) == len(ck) >= 1, (cq, ck)
    if uq is None:
        assert cq[-1] == total_q, f"cu_seqlens_q[-1] = {cq[-1]} but total_q = {total_q} (no seqused_q)"
    segments = []
    for b in range(len(cq) - 1):
        assert 0 <= cq[b] <= cq[b + 1] <= total_q, (b, cq)
        len_q = cq[b + 1] - cq[b] if uq is None else uq[b]
        assert 0 <= len_q <= cq[b + 1] - cq[b], (b, len_q)
        if uk is None:
            assert 0 <= ck[b] <= ck[b + 1] <= total_k, (b, ck)
            len_k = ck[b + 1] - ck[b]
        else:  # FA3's rule: seqused_k rows from cu_seqlens_k[b], offsets in any order (a batch index's picks)
            len_k = uk[b]
            assert 0 <= ck[b] and 0 <= len_k and ck[b] + len_k <= total_k, (b, ck[b], len_k, total_k)
        assert len_q <= max_seqlen_q and len_k <= max_seqlen_k, (b, len_q, len_k, max_seqlen_q, max_seqlen_k)
        segments.append((cq[b], len_q, ck[b], len_k))
    return segments


def emulate_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                       softmax_scale, causal, window_size_left=-1, window_size_right=-1, top_left=False,
                       softcap=0.0, sink=None, num_splits=1, pack_gqa=1):
    """What varlen_fwd returns: each sequence through emulate_fwd; rows outside every used part
    out 0 and lse -inf (the sink with one), as rows that see no key. pack_gqa > 1: q's rows are
    PackGQA's and out / lse come back per query head (the binding's check_pack_gqa refusals too)."""
    if pack_gqa != 1:
        assert pack_gqa > 1 and q.shape[0] % pack_gqa == 0 and not softcap and seqused_q is None and sink is None
        out, lse = emulate_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                                      max_seqlen_k, softmax_scale, causal, window_size_left, window_size_right,
                                      top_left, softcap, sink, num_splits)
        return packgqa.unpack_rows(out, pack_gqa), packgqa.unpack_lse(lse, pack_gqa)
    total_q, heads_q, head_dim = q.shape
    # The binding's rule: v's head dim is q's, or one the forward has kernels of its own for.
    assert v.shape[-1] == head_dim or manifest.own_value_kernels(head_dim, v.shape[-1]), (q.shape, v.shape)
    segments = varlen_segments(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                               total_q, k.size(0))
    out = torch.zeros(total_q, heads_q, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((heads_q, total_q), float("-inf"), dtype=torch.float32, device=q.device)
    if sink is not None:
        lse[:] = sink.view(-1, 1)
    for q_start, len_q, k_start, len_k in segments:
        if len_q == 0 or len_k == 0:
            continue
        o, l = emulate_fwd(
            q[q_start : q_start + len_q][None], k[k_start : k_start + len_k][None],
            v[k_start : k_start + len_k][None], softmax_scale, causal, window_size_left, window_size_right, top_left,
            softcap, sink,
        )
        out[q_start : q_start + len_q] = o[0]
        lse[:, q_start : q_start + len_q] = l[0]
    return out, lse


def emulate_varlen_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                       max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size_left=-1,
                       window_size_right=-1, top_left=False, deterministic=False, softcap=0.0, sink=None):
    """(dq, dk, dv, dsink) of varlen_fwd per sequence through emulate_bwd; zero outside the used parts."""
    check_bwd_head_dims(dict(q=q, k=k, v=v, out=out, dout=dout))
    segments = varlen_segments(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                               q.size(0), k.size(0))
    assert softmax_lse.shape == (q.size(1), q.size(0)) and softmax_lse.dtype == torch.float32, softmax_lse.shape
    assert dout.shape == out.shape == (*q.shape[:-1], v.shape[-1]), (dout.shape, out.shape, q.shape)
    dq, dk, dv = (torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dsink = torch.zeros(0 if sink is None else sink.shape, dtype=torch.float32, device=q.device)
    for q_start, len_q, k_start, len_k in segments:
        if len_q == 0 or len_k == 0:
            continue
        rows, keys = slice(q_start, q_start + len_q), slice(k_start, k_start + len_k)
        g = emulate_bwd(
            dout[rows][None], q[rows][None], k[keys][None], v[keys][None], out[rows][None],
            softmax_lse[:, rows][None], softmax_scale, causal, window_size_left, window_size_right, top_left,
            softcap=softcap, sink=sink,
        )
        if sink is not None:
            dsink += g[3]
        dq[rows] = g[0][0]
        # Segments of k may overlap when cu_seqlens_k repeats (seqused_k shorter than segments never
        # overlaps); summing is what the kernel's atomics would do.
        dk[keys] += g[1][0]
        dv[keys] += g[2][0]
    return dq, dk, dv, dsink


class EmulatedVarlen:
    """Records the calls that reached one emulated varlen op (every argument, by name)."""

    def __init__(self, schema: str, emulation) -> None:
        self.schema = torch._C.parse_schema(f"flash_attn_hopper::{schema}")
        self.emulation = emulation
        self.calls: list[dict] = []

    def __call__(self, *args, **kwargs):
        # The dispatcher leaves trailing arguments equal to their defaults out of a Python kernel's call.
        call = {a.name: a.default_value for a in self.schema.arguments if a.has_default_value()}
        call.update(zip([a.name for a in self.schema.arguments], args), **kwargs)
        self.calls.append(call)
        return self.emulation(**call)


@contextlib.contextmanager
def emulated_varlen_ops(monkeypatch: pytest.MonkeyPatch, device_type: str = "cpu", backward: bool = True):
    """Give varlen_fwd (and, with ``backward``, varlen_bwd) the emulations as kernels for ``device_type``;
    yields (fwd, bwd) recorders (bwd None without ``backward``).

    Where the extension defines an op, the emulation becomes its kernel for that device (the
    real schema, fake kernel and autograd formula stay).  Where it does not (no extension, as
    on CPU-only machines, or a build without the backward), a stand-in op with the contract's
    schema (ops.VARLEN_FWD_SCHEMA / VARLEN_BWD_SCHEMA) is defined and given ops.py's fake
    kernel, autograd formula and deterministic variant (ops.register_varlen), and removed
    again afterwards.  Also lets the routing accept ``device_type`` and every head dim / dtype.
    """
    from flash_attn_hopper import _build_info, support

    monkeypatch.setattr(support, "device_refusal", lambda q, k, v, names=None: None)
    monkeypatch.setattr(_build_info, "COMPILED", None)
    fwd = EmulatedVarlen(ops.VARLEN_FWD_SCHEMA, emulate_varlen_fwd)
    bwd = EmulatedVarlen(ops.VARLEN_BWD_SCHEMA, emulate_varlen_bwd) if backward else None
    libraries = []
    try:
        impl = torch.library.Library("flash_attn_hopper", "IMPL")
        libraries.append(impl)
        if ops.has_varlen_fwd_op():
            impl.impl("varlen_fwd", fwd, device_type.upper())
        else:
            stand_in = torch.library.Library("flash_attn_hopper", "FRAGMENT")
            libraries.append(stand_in)
            stand_in.define(ops.VARLEN_FWD_SCHEMA)
            stand_in.impl("varlen_fwd", fwd, device_type.upper())
            ops.register_varlen(stand_in)
        if backward:
            if ops.has_varlen_bwd_op():
                impl.impl("varlen_bwd", bwd, device_type.upper())
            else:
                stand_in = torch.library.Library("flash_attn_hopper", "FRAGMENT")
                libraries.append(stand_in)
                stand_in.define(ops.VARLEN_BWD_SCHEMA)
                stand_in.impl("varlen_bwd", bwd, device_type.upper())
                ops.register_varlen_bwd_fake(lib=stand_in)
        elif ops.has_varlen_bwd_op():
            pytest.skip("this build defines varlen_bwd; a build without it cannot be emulated")
        yield fwd, bwd
    finally:
        for library in reversed(libraries):
            library._destroy()


# --------------------------------------------------------------------------
# The paged-KV op (paged.PAGED_FWD_SCHEMA)
# --------------------------------------------------------------------------


def emulate_paged_fwd(q, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                      max_seqlen_k, softmax_scale, causal, window_size_left=-1, window_size_right=-1,
                      top_left=False, softcap=0.0, sink=None, num_splits=1, pack_gqa=1):
    """What paged_fwd returns: sequence b's keys gathered from its pages (logical positions
    cu_seqlens_k[b] + j, j < seqused_k[b]) into a packed varlen call. Strict where the kernels clamp:
    a position past the page-table row or a page number outside the cache raises AssertionError."""
    num_pages, page_size = k_cache.shape[:2]
    batch, max_pages = page_table.shape
    capacity = max_pages * page_size
    starts, used = cu_seqlens_k.tolist(), seqused_k.tolist()
    assert len(starts) == batch + 1 and len(used) == batch, (len(starts), len(used), batch)
    rows_k, rows_v, cu_k = [], [], [0]
    for b in range(batch):
        assert 0 <= starts[b] and 0 <= used[b] <= max_seqlen_k and starts[b] + used[b] <= capacity, (b, starts, used)
        pos = torch.arange(starts[b], starts[b] + used[b])
        pages = page_table[b].long()[pos // page_size] if used[b] else torch.zeros(0, dtype=torch.long)
        assert bool(((pages >= 0) & (pages < num_pages)).all()), (b, pages)
        rows_k.append(k_cache[pages, pos % page_size])
        rows_v.append(v_cache[pages, pos % page_size])
        cu_k.append(cu_k[-1] + used[b])
    cu_k = torch.tensor(cu_k, dtype=torch.int32, device=q.device)
    return emulate_varlen_fwd(q, torch.cat(rows_k), torch.cat(rows_v), cu_seqlens_q, cu_k, None, None, max_seqlen_q,
                              max_seqlen_k, softmax_scale, causal, window_size_left, window_size_right, top_left,
                              softcap, sink, num_splits, pack_gqa)


@contextlib.contextmanager
def emulated_paged_op(monkeypatch: pytest.MonkeyPatch):
    """paged.paged_fwd_op returns the emulation (a recorder of its calls), with the varlen ops
    emulated too (the paged path runs the varlen checks); yields the recorder."""
    from flash_attn_hopper import paged

    rec = EmulatedVarlen(paged.PAGED_FWD_SCHEMA, emulate_paged_fwd)
    with emulated_varlen_ops(monkeypatch):
        monkeypatch.setattr(paged, "paged_fwd_op", lambda: rec)
        monkeypatch.setattr(paged, "has_paged_op", lambda: True)
        yield rec
