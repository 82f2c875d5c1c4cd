"""Small problems for the torch.ops.mlakit tests (CPU and GPU): seeded, built on the CPU,
moved to `device`. Import after pytest.importorskip("torch")."""

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
