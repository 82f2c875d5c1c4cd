"""Problems and float64 PyTorch references for the GPU tests (written here, independent of
mlakit: FP8 dequantization included). Import after pytest.importorskip("torch")."""

import math

import pytest
import torch

import mlakit
from accuracy import check_out, check_stat

D_QK, D_V = 576, 512

def require_gpu():
    """Skips the calling test module without CUDA, or with an mlakit built without it."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device", allow_module_level=True)
    try:
        mlakit._mlakit.mla_decode_workspace_size(1, 1, 16, 1)
    except RuntimeError as e:
        pytest.skip(f"mlakit cannot use the GPU: {e}", allow_module_level=True)

def capture(step):
    """A CUDA graph of `step` (called once first on a side stream, outside the capture, as
    PyTorch asks) and the outputs of the captured call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


def generator(seed):
    return torch.Generator().manual_seed(seed)

def activations(gen, shape, dtype=torch.bfloat16):
    """q ~ N(0, 1) (FlashMLA's test distribution), on the GPU."""
    return torch.randn(shape, generator=gen).to(dtype).cuda()

def cache_values(gen, shape):
    """Cache ~ N(0, 1) / 10 clamped to [-1, 1] (float32, on the GPU)."""
    return (torch.randn(shape, generator=gen) / 10).clamp(-1, 1).cuda()

def block_table(gen, capacity, page=64):
    """A block table for sequences of up to `capacity[i]` tokens (-1 past each sequence's
    blocks, one spare column) over randomly permuted physical blocks; and the block count."""
    blocks = [math.ceil(n / page) for n in capacity]
    num_blocks = sum(blocks) + 3
    physical = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(capacity), max(1, max(blocks)) + 1), -1, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks):
        table[i, :nb] = physical[used : used + nb].int()
        used += nb
    return table.cuda(), num_blocks


def fill_cache(gen, table, capacity, num_blocks, h_kv=1, page=64, dtype=torch.bfloat16):
    """A cache holding `capacity[i]` tokens of sequence i where `table` says, NaN elsewhere."""
    kv = torch.full((num_blocks, page, h_kv, D_QK), float("nan"), dtype=dtype, device="cuda")
    for i, n in enumerate(capacity):
        nb = math.ceil(n / page)
        if nb == 0:
            continue
        values = cache_values(gen, (nb * page, h_kv, D_QK))
        values[n:] = float("nan")
        kv[table[i, :nb].long()] = values.view(nb, page, h_kv, D_QK).to(dtype)
    return kv


def paged_cache(gen, capacity, h_kv=1, page=64, dtype=torch.bfloat16):
    """(kv_cache, block_table) for sequences of `capacity[i]` tokens."""
    table, num_blocks = block_table(gen, capacity, page)
    return fill_cache(gen, table, capacity, num_blocks, h_kv, page, dtype), table


def seqlens(lengths):
    return torch.tensor(lengths, dtype=torch.int32, device="cuda")

def _softmax_rows(z):
    """(weights, natural-log lse) of float64 logits whose last dim may be all -inf."""
    lse = torch.logsumexp(z, dim=-1)
    weights = torch.exp(z - lse.unsqueeze(-1)).nan_to_num(0.0)
    return weights, lse

def dense_reference(q, kv, table, lengths, scale=None, causal=False):
    """Float64 dense MLA decode: (out [b, s_q, h_q, 512], lse [b, h_q, s_q]); empty rows 0, +inf."""
    b, s_q, h_q, d_qk = q.shape
    page, h_kv = kv.shape[1], kv.shape[2]
    group = h_q // h_kv
    scale = d_qk**-0.5 if scale is None else scale
    out = torch.zeros(b, s_q, h_q, D_V, dtype=torch.float64, device="cuda")
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64, device="cuda")
    for i, n in enumerate(lengths.tolist()):
        if n <= 0:
            continue
        nb = math.ceil(n / page)
        keys = kv[table[i, :nb].long()].reshape(nb * page, h_kv, D_QK)[:n].double()
        positions = torch.arange(n, device="cuda")
        visible = positions.view(1, n) <= (n - s_q + torch.arange(s_q, device="cuda")).view(s_q, 1)
        for hk in range(h_kv):
            heads = slice(hk * group, (hk + 1) * group)
            z = torch.einsum("thd,kd->thk", q[i, :, heads].double(), keys[:, hk]) * scale
            if causal and s_q > 1:
                z = z.masked_fill(~visible.unsqueeze(1), -math.inf)
            weights, row_lse = _softmax_rows(z)
            out[i, :, heads] = weights @ keys[:, hk, :D_V]
            lse[i, heads] = row_lse.T.masked_fill(row_lse.T == -math.inf, math.inf)
    return out, lse

def dequantize_fp8_cache(cache):
    """The FP8 token format (docs/contract.md) read with PyTorch: [..., 656] uint8 -> [..., 576] bfloat16."""
    nope = cache[..., :512].contiguous().view(torch.float8_e4m3fn).float()
    scales = cache[..., 512:528].contiguous().view(torch.float32)
    rope = cache[..., 528:].contiguous().view(torch.bfloat16)
    nope = (nope.unflatten(-1, (4, 128)) * scales.unsqueeze(-1)).flatten(-2)
    return torch.cat([nope.to(torch.bfloat16), rope], dim=-1)

def fp8_paged_cache(gen, num_blocks, page=64):
    """A bf16 cache [num_blocks, page, 1, 576] quantized by mlakit on the GPU; its last block
    is poisoned with NaN bytes (tests index only the others)."""
    kv = cache_values(gen, (num_blocks, page, 1, D_QK)).to(torch.bfloat16)
    cache = mlakit.quantize_fp8_cache(kv)
    cache[-1] = 0xFF
    return kv, cache

def sparse_indices(gen, b, s_q, topk, num_valid_tokens, num_tokens):
    """Slots of valid tokens with duplicates, -1 and past-the-end entries; the last query
    token of sequence 0 has none valid."""
    idx = torch.randint(0, num_valid_tokens, (b, s_q, topk), generator=gen, dtype=torch.int32)
    idx[torch.rand(idx.shape, generator=gen) < 0.1] = -1
    idx[torch.rand(idx.shape, generator=gen) < 0.05] = num_tokens + 7
    idx[0, -1] = -1
    return idx.cuda()

def sparse_reference(q, cache, indices, scale=None, topk_length=None, attn_sink=None):
    """Float64 sparse decode over the dequantized cache: (out [b, s_q, h_q, 512], lse [b, h_q, s_q])."""
    keys_all = dequantize_fp8_cache(cache).reshape(-1, D_QK).double()
    topk = indices.shape[-1]
    scale = D_QK**-0.5 if scale is None else scale
    valid = (indices >= 0) & (indices < keys_all.shape[0])
    if topk_length is not None:
        valid &= torch.arange(topk, device="cuda").view(1, 1, topk) < topk_length.view(-1, 1, 1)
    keys = keys_all[torch.where(valid, indices, 0).long()]  # [b, s_q, topk, 576]
    z = torch.einsum("bshd,bskd->bshk", q.double(), keys) * scale
    z = z.masked_fill(~valid.unsqueeze(2), -math.inf)
    weights, lse = _softmax_rows(z)  # lse [b, s_q, h_q]
    out = torch.einsum("bshk,bskd->bshd", weights, keys[..., :D_V])
    if attn_sink is not None:
        out *= (1 / (1 + torch.exp(attn_sink.double().view(1, 1, -1) - lse))).unsqueeze(-1)
    return out, lse.masked_fill(lse == -math.inf, math.inf).transpose(1, 2)

def sparse_prefill_reference(q, kv, indices, sm_scale, topk_length=None, attn_sink=None, natural=False):
    """Float64 sparse prefill: (out [s_q, h_q, 512], max_logits, lse), statistics in base 2
    (natural log with `natural`)."""
    s_q, topk = indices.shape[0], indices.shape[-1]
    valid = (indices[:, 0] >= 0) & (indices[:, 0] < kv.shape[0])
    if topk_length is not None:
        valid &= torch.arange(topk, device="cuda").view(1, topk) < topk_length.view(s_q, 1)
    keys = kv[:, 0].double()[torch.where(valid, indices[:, 0], 0).long()]  # [s_q, topk, d_qk]
    z = torch.einsum("shd,skd->shk", q.double(), keys) * sm_scale
    z = z.masked_fill(~valid.unsqueeze(1), -math.inf)
    weights, lse = _softmax_rows(z)
    out = torch.einsum("shk,skd->shd", weights, keys[..., :D_V])
    if attn_sink is not None:
        out *= (1 / (1 + torch.exp(attn_sink.double().view(1, -1) - lse))).unsqueeze(-1)
    to_base = 1.0 if natural else 1 / math.log(2)
    return out, z.amax(dim=-1) * to_base, lse.masked_fill(lse == -math.inf, math.inf) * to_base


def to_numpy(t):
    return t.detach().float().cpu().numpy() if t.dtype != torch.float64 else t.detach().cpu().numpy()

def check(out, lse, ref_out, ref_lse):
    """The accuracy rules (docs/contract.md) on GPU results."""
    check_out(to_numpy(out), to_numpy(ref_out))
    check_stat(to_numpy(lse), to_numpy(ref_lse))

