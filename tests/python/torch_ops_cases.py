"""Small problems for the torch.ops.mlakit tests (CPU and GPU): seeded, built on the CPU,
moved to `device`. Import after pytest.importorskip("torch")."""

import math

import torch

PAGE = 16


def gen(seed):
    return torch.Generator().manual_seed(seed)


def paged(g, lengths, heads, d, dtype=torch.bfloat16):
    """A shuffled block table for `lengths` and a [num_blocks, PAGE, heads, d] cache."""
    blocks = [max(1, -(-n // PAGE)) for n in lengths]
    num_blocks = sum(blocks) + 1
    physical = torch.randperm(num_blocks, generator=g).to(torch.int32)
    table = torch.full((len(lengths), max(blocks)), -1, dtype=torch.int32)
    at = 0
    for i, n in enumerate(blocks):
        table[i, :n] = physical[at:at + n]
        at += n
    cache = torch.randn((num_blocks, PAGE, heads, d), generator=g).to(dtype)
    return table, cache


def mla_problem(seed, lengths=(20, 7), s_q=1, h_q=4, device="cpu"):
    """(q, kv_cache, block_table, cache_seqlens) of a dense MLA decode."""
    g = gen(seed)
    table, kv = paged(g, lengths, 1, 576)
    q = torch.randn((len(lengths), s_q, h_q, 576), generator=g).to(torch.bfloat16)
    return tuple(x.to(device) for x in (q, kv, table, torch.tensor(lengths, dtype=torch.int32)))


def v4_sparse_args(seed, b=2, s_q=2, h_q=4, topk=8, extra_topk=4, device="cpu"):
    """The arguments of a DeepSeek V4 sparse decode with a second cache, as a dict: q [b, s_q,
    h_q, 512], kv_cache and extra_kv_cache quantized by mlakit (584-byte tokens, padded block
    stride; page sizes 16 and 8), indices / extra_indices (with -1 and past-the-end slots) and
    extra_topk_length."""
    import mlakit

    g = gen(seed)
    q = torch.randn((b, s_q, h_q, 512), generator=g).to(torch.bfloat16).to(device)
    caches = [mlakit.quantize_fp8_v4_cache((torch.randn((n, page, 1, 512), generator=g) / 10).to(torch.bfloat16)
                                           .to(device)) for n, page in ((3, PAGE), (2, 8))]
    idx = [torch.randint(-1, c.shape[0] * c.shape[1] + 2, (b, s_q, k), generator=g, dtype=torch.int32).to(device)
           for c, k in zip(caches, (topk, extra_topk))]
    lengths = torch.randint(0, extra_topk + 1, (b,), generator=g, dtype=torch.int32).to(device)
    return dict(q=q, kv_cache=caches[0], indices=idx[0], extra_kv_cache=caches[1], extra_indices=idx[1],
                extra_topk_length=lengths)


def gqa_problem(seed, lengths=(20, 7), s_q=1, h_q=8, h_kv=2, d=64, device="cpu"):
    """(q, k_cache, v_cache, block_table, cache_seqlens, [k_new, v_new]) of a GQA decode."""
    g = gen(seed)
    table, k = paged(g, lengths, h_kv, d)
    v = torch.randn(k.shape, generator=g).to(torch.bfloat16)
    q = torch.randn((len(lengths), s_q, h_q, d), generator=g).to(torch.bfloat16)
    new = [torch.randn((len(lengths), s_q, h_kv, d), generator=g).to(torch.bfloat16).to(device) for _ in range(2)]
    q, k, v, table, lens = (x.to(device) for x in (q, k, v, table, torch.tensor(lengths, dtype=torch.int32)))
    return q, k, v, table, lens, new


def gqa_args(q, k, v, table, lengths, plan, **kw):
    """The positional arguments of torch.ops.mlakit.gqa_decode (defaults: no options)."""
    o = dict(k_scale=None, v_scale=None, rope_style="", rope_theta=10000.0, rotary_dim=0, alibi_slopes=None,
             finished=None, softmax_scale=None, causal=False, window=0, softcap=0.0)
    o.update(kw)
    return (q, k, v, table, lengths, plan[0], plan[1], o["k_scale"], o["v_scale"], o["rope_style"], o["rope_theta"],
            o["rotary_dim"], o["alibi_slopes"], o["finished"], o["softmax_scale"], o["causal"], o["window"],
            o["softcap"])


def merge_states_args(seed, n=3, rows=(5, 4), d=64, lse_base="e", out_lse_base="e", device="cpu"):
    """The arguments of torch.ops.mlakit.merge_states: n bf16 states [rows..., d] (views of
    one stacked tensor), their float32 LSEs (one state of row 0 empty: +inf), the bases."""
    g = gen(seed)
    o = torch.randn((n, *rows, d), generator=g).to(torch.bfloat16).to(device)
    lse = (torch.randn((n, *rows), generator=g) * 3).to(device)
    lse.view(n, -1)[0, 0] = float("inf")
    return list(o), list(lse), lse_base, out_lse_base


def fake_args(mode, args):
    """`args` with every tensor, also in a list of tensors, a fake tensor of `mode`."""
    def fake(a):
        if isinstance(a, torch.Tensor):
            return mode.from_tensor(a)
        if isinstance(a, list) and a and all(isinstance(x, torch.Tensor) for x in a):
            return [mode.from_tensor(x) for x in a]
        return a
    return [fake(a) for a in args]


# ---- dense MHA prefill and its backward ----------------------------------------------------


# The scales of the backward's tests (support/mha_backward_case.h: dout_std 0.03, v ~ N(0, 0.01)
# times 4). The accuracy rule's abs 1e-3 is absolute, so they decide what it tests: dv = sum_t P
# dout_t grows with dout alone, and kernels that round P to 16 bits for it (FlashAttention's
# backward, mlakit's portable one) move a cancelling sum over many rows by ~2^-9 * |dout| *
# sqrt(rows); dq and dk grow with |dout| * |v| and stay at ~1e-3 and above. (D = rowsum(dout *
# out) from a bf16 out moves dq and dk by ~0.5% of their largest element too.)
DOUT_STD = 0.03
V_STD = 0.4


def prefix_sums(lengths, device="cpu"):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def varlen_problem(seed, lq, lk, h_q=4, h_kv=2, d_qk=64, d_v=64, dtype=torch.bfloat16, pad_q=0, pad_k=0,
                   device="cpu"):
    """(q, k, v, cu_seqlens_q, cu_seqlens_k, dout) of a varlen prefill with `pad_q` / `pad_k`
    rows after the last sequence; q, k ~ N(0, 1), v ~ N(0, 1) * V_STD, dout ~ N(0, 1) * DOUT_STD."""
    g = gen(seed)
    total_q, total_k = sum(lq) + pad_q, sum(lk) + pad_k
    q = torch.randn((total_q, h_q, d_qk), generator=g).to(dtype)
    k = torch.randn((total_k, h_kv, d_qk), generator=g).to(dtype)
    v = (torch.randn((total_k, h_kv, d_v), generator=g) * V_STD).to(dtype)
    dout = (torch.randn((total_q, h_q, d_v), generator=g) * DOUT_STD).to(dtype)
    return (q.to(device), k.to(device), v.to(device), prefix_sums(lq, device), prefix_sums(lk, device),
            dout.to(device))


def attention(q, k, v, cu_q, cu_k, scale=None, causal=False):
    """The attention forward in float64, written with differentiable PyTorch ops (independent
    of mlakit): out [total_q, h_q, d_v], rows in no sequence and queries that see no key 0."""
    q, k, v = q.double(), k.double(), v.double()
    total_q, h_q, d_qk = q.shape
    group = h_q // k.shape[1]
    scale = d_qk**-0.5 if scale is None else scale
    out = q.new_zeros((total_q, h_q, v.shape[2]))
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for q0, q1, k0, k1 in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:]):
        n_q, n_k = q1 - q0, k1 - k0
        first = max(0, n_q - n_k) if causal else 0  # queries before it see no key (bottom-right)
        if n_k == 0 or first >= n_q:
            continue
        keys = k[k0:k1].repeat_interleave(group, dim=1)  # [n_k, h_q, d_qk]
        values = v[k0:k1].repeat_interleave(group, dim=1)
        z = torch.einsum("thd,jhd->htj", q[q0 + first:q1], keys) * scale  # [h_q, n_q - first, n_k]
        if causal:
            t = torch.arange(first, n_q, device=q.device).view(-1, 1)
            z = z.masked_fill(torch.arange(n_k, device=q.device).view(1, -1) > t + n_k - n_q, -math.inf)
        out[q0 + first:q1] = torch.einsum("htj,jhd->thd", torch.softmax(z, dim=-1), values)
    return out


def attention_grads(dout, q, k, v, cu_q, cu_k, scale=None, causal=False):
    """(dq, dk, dv) of sum(attention(...) * dout) by PyTorch autograd in float64, on the CPU."""
    leaves = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    out = attention(*leaves, cu_q.cpu(), cu_k.cpu(), scale, causal)
    return torch.autograd.grad((out * dout.detach().cpu().double()).sum(), leaves)


def check_grad(actual, expected, name):
    """The backward's accuracy rule (docs/contract.md, Accuracy; SPEC section 8): every element
    within abs 1e-3 or rel 8/128 of the float64 reference, the cosine difference 1 - 2<a,e> /
    (|a|^2 + |e|^2) <= 7e-6 over the tensor, no NaN or infinity."""
    a = torch.as_tensor(actual).detach().cpu().double()
    e = torch.as_tensor(expected).detach().cpu().double()
    assert a.shape == e.shape, f"{name}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
    assert torch.isfinite(a).all(), f"{name}: NaN or infinity in the result"
    err = (a - e).abs()
    bad = err > torch.clamp(e.abs() * (8 / 128), min=1e-3)
    assert not bad.any(), f"{name}: {int(bad.sum())} elements out of tolerance, worst error {float(err.max()):.3g}"
    norms = float((a * a).sum() + (e * e).sum())
    if norms > 0:
        cos_diff = 1 - 2 * float((a * e).sum()) / norms
        assert cos_diff <= 7e-6, f"{name}: cosine difference {cos_diff:.3g} > 7e-6"


# opcheck's tests for mha_prefill on inputs that require grad: all but the AOTAutograd one, whose
# random gradient of lse the backward refuses (NotImplementedError).
WITH_GRAD = ("test_schema", "test_autograd_registration", "test_faketensor")


def leaves(*xs):
    """Copies of `xs` that require grad: the leaves of a new autograd graph."""
    return tuple(x.detach().clone().requires_grad_() for x in xs)


def backward_of(outputs, dout):
    """Backpropagates sum(out * dout) (out the first output) in float32 (dout's bf16 values
    arrive exactly as the gradient of out)."""
    (outputs[0].float() * dout.float()).sum().backward()


def check_packed_form_gradients(q, k, v, cu, max_seqlen, dout, **options):
    """The gradients of flash_attn_varlen_qkvpacked_func's qkv and flash_attn_varlen_kvpacked_func's
    q and kv (q, k, v of head_dim 128, one length per sequence on both sides) are those of
    flash_attn_varlen_func's q, k, v, put together by autograd, bit for bit. `options`: the
    functions' keywords (causal, deterministic)."""
    from mlakit import flash_mla

    n = max_seqlen
    tq, tk, tv = leaves(q, k, v)
    backward_of(flash_mla.flash_attn_varlen_func(tq, tk, tv, cu, cu, n, n, **options), dout)
    (qkv,) = leaves(torch.cat([q, k, v], dim=-1))
    backward_of(flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu, n, 128, **options), dout)
    assert torch.equal(qkv.grad, torch.cat([tq.grad, tk.grad, tv.grad], dim=-1))
    q2, (kv,) = leaves(q)[0], leaves(torch.cat([k, v], dim=-1))
    backward_of(flash_mla.flash_attn_varlen_kvpacked_func(q2, kv, cu, cu, n, n, 128, **options), dout)
    assert torch.equal(q2.grad, tq.grad) and torch.equal(kv.grad, torch.cat([tk.grad, tv.grad], dim=-1))


def eager_and_compiled_grads(loss, inputs, backend="inductor"):
    """(eager, compiled): each (loss value, *gradients of `inputs`) of `loss` run on new leaves
    of `inputs`, eagerly and compiled by torch.compile(fullgraph=True, backend=backend), once
    `loss` is seen to trace without a graph break."""

    def grads(fn):
        xs = leaves(*inputs)
        value = fn(*xs)
        value.backward()
        if value.is_cuda:
            torch.cuda.synchronize()
        return (value,) + tuple(x.grad for x in xs)

    eager = grads(loss)
    explained = torch._dynamo.explain(loss)(*leaves(*inputs))
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    return eager, grads(torch.compile(loss, fullgraph=True, backend=backend))
