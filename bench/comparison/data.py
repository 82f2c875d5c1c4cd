"""Input tensors of each case, following FlashMLA's own test conventions, built once per
case and handed to every side unchanged.

- Dense decode: lengths ~ normal(s_k, s_k / 2), floored, at least s_q; a paged bf16 cache
  [num_blocks, 64, h_kv, 576] whose block table is a shuffled permutation of the blocks,
  NaN in every slot past a sequence's length (a kernel that reads one shows it).
- Sparse FP8 decode: each sequence owns s_k tokens (shuffled block table); each query token
  lists topk distinct tokens of its sequence; the 656-byte FP8 cache holds NaN bytes (0xFF:
  NaN as e4m3, float32 and bf16) in every token no index lists.
- Sparse FP8 decode, DeepSeek V4 (FlashMLA's V4 decode shapes): sequence lengths ~ normal(s_k,
  s_k / 4), at least topk; the first cache holds each sequence's tokens (page `page`, shuffled
  block table), each query token lists topk distinct of them; the optional second cache holds
  each sequence's last extra_topk tokens (page `extra_page`), every query token listing all of
  them (a window). The 584-byte layout's blocks padded to a multiple of 576 bytes, as FlashMLA
  pads them; 0xFF (NaN) in every unlisted record, scale record and padding byte.
- Sparse prefill: topk distinct rows per query token, uniform over s_kv or 90% of them in the
  last `window` rows, in random order; d_qk 576 (V3.2) or 512 (V4).
- GQA decode: every sequence holds s_k tokens (SDPA's contiguous cache has no lengths); K and
  V [b, h_kv, s_k, d] bf16 for SDPA, the same values paged [num_blocks, 64, h_kv, d] through a
  shuffled block table for mlakit. int8 / fp8 caches: quantized per (token, kv head) by the
  contract's rules (written here in PyTorch), SDPA's cache holding the dequantized values.
- MHA prefill: q, k ~ N(0, 1), v ~ N(0, 1) / 10 (the GPU tests' scale). Every sequence s
  long: [b, h, s, d] for SDPA, the same values as packed rows [b * s, h, d] with cu_seqlens for
  mlakit. The varlen mix: packed rows [tokens, h, d] with cu_seqlens for mlakit, and for SDPA
  [1, h, n, d] views of those very rows, one per sequence; lengths from varlen_lengths. Its
  backward: the same q, k, v and dout ~ N(0, 1) / 10 (as v: P is rounded to 16 bits on every
  side, and at N(0, 1) no 16-bit kernel meets the backward's elementwise rule), in both forms.
- Merge: n states o [n, rows..., d] ~ N(0, 1) / 4 (bf16 or float32) and their LSEs ~
  N(4, 3) float32 (weights spread over orders of magnitude; no empty state: the PyTorch side
  has no rule for them), stacked; the context-parallel decode's LSEs in the decode's [n, b,
  h_q, s_q] memory, handed over as the [n, b, s_q, h_q] view.
q ~ N(0, 1); the decode caches ~ N(0, 1) / 10 clamped to [-1, 1] (FlashMLA's decode tests, and
the scale the contract's absolute tolerance (docs/contract.md) is meant for: with N(0, 1) cache values the bf16
rounding of P alone moves outputs of the shortest sequences by ~1e-2 in both libraries);
the prefill's kv N(0, 1). Lengths, block tables and index choices come from a CPU
generator (the same draw on any device); the large tensors from one on the device.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Tuple

import torch

from .cases import Case

D_QK, D_V, FP8_TOKEN_BYTES = 576, 512, 656
E4M3_MAX = 448.0
# DeepSeek V4's cache (docs/contract.md): per block, records of 448 e4m3 + 64 bf16, then 8-byte
# records of 7 UE8M0 scales (one per 64 values) and an unused byte.
V4_D_QK, V4_NOPE, V4_TILE, V4_RECORD, V4_TOKEN_BYTES = 512, 448, 64, 576, 584
INDEX_CHUNK_ROWS = 256  # rows of random keys drawn at once when choosing distinct indices


@dataclasses.dataclass
class Inputs:
    tensors: Dict[str, Any]  # the arguments shared by every side
    info: Dict[str, Any]  # what the JSON line records: seed, mean s_k drawn, flops, bytes


def generate(case: Case, seed: int, device: str) -> Inputs:
    return _GENERATORS[case.family](case.params, seed, torch.device(device))


def _generators(seed: int, device: torch.device):
    host = torch.Generator().manual_seed(seed)
    dev = torch.Generator(device=device).manual_seed(seed + 1)
    return host, dev


def _normal(shape, dtype, device, gen) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device).normal_(generator=gen)


def _cache_values(shape, device, gen) -> torch.Tensor:
    """Decode cache values: N(0, 1) / 10 clamped to [-1, 1], in bf16."""
    values = torch.empty(shape, dtype=torch.float32, device=device).normal_(generator=gen)
    return (values / 10).clamp_(-1, 1).to(torch.bfloat16)


def _varlen(b: int, s_k: int, s_q: int, gen: torch.Generator, varlen: bool) -> torch.Tensor:
    if not varlen:
        return torch.full((b,), s_k, dtype=torch.int32)
    lengths = torch.normal(float(s_k), s_k / 2, (b,), generator=gen).floor()
    return lengths.clamp(min=s_q).to(torch.int32)


def _shuffled_block_table(b: int, blocks_per_seq: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(b * blocks_per_seq, generator=gen).view(b, blocks_per_seq).to(torch.int32)


def dense_decode(p: Dict[str, Any], seed: int, device: torch.device) -> Inputs:
    host, dev = _generators(seed, device)
    b, s_q, h_q, h_kv, page = p["b"], p["s_q"], p["h_q"], p["h_kv"], p["page"]
    lengths = _varlen(b, p["s_k"], s_q, host, p["varlen"])
    blocks_per_seq = math.ceil(int(lengths.max()) / page)
    block_table = _shuffled_block_table(b, blocks_per_seq, host)
    cache = _cache_values((b * blocks_per_seq, page, h_kv, D_QK), device, dev)
    q = _normal((b, s_q, h_q, D_QK), torch.bfloat16, device, dev)
    # NaN in every slot past each sequence's length.
    pos = torch.arange(blocks_per_seq * page)
    physical = block_table.long()[:, pos // page] * page + pos % page  # [b, positions]
    unused = physical[pos[None, :] >= lengths.long()[:, None]]
    cache.view(-1, h_kv, D_QK)[unused.to(device)] = float("nan")

    keys = lengths.double()
    attended = keys * s_q - (s_q * (s_q - 1) / 2 if p["causal"] else 0)  # per sequence, summed over its tokens
    info = dict(
        seed=seed,
        mean_s_k=float(keys.mean()),
        flops=float(h_q * (2 * D_QK + 2 * D_V) * attended.sum()),
        bytes=float(b * s_q * h_q * (D_QK + D_V) * 2 + keys.sum() * h_kv * D_QK * 2),
    )
    tensors = dict(
        q=q, k_cache=cache, block_table=block_table.to(device), cache_seqlens=lengths.to(device), causal=p["causal"]
    )
    return Inputs(tensors, info)


def quantize_fp8(kv: torch.Tensor) -> torch.Tensor:
    """bf16 [..., 576] -> the 656-byte FP8 cache token (FlashMLA's documented layout): 512
    e4m3 NoPE values in 4 tiles of 128, the 4 float32 tile scales (amax / 448; docs/contract.md),
    64 bf16 RoPE values."""
    nope = kv[..., :D_V].float().unflatten(-1, (4, 128))
    scale = nope.abs().amax(-1) / E4M3_MAX
    scaled = torch.where(scale[..., None] > 0, nope / scale[..., None], torch.zeros_like(nope))
    values = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    out = torch.empty(kv.shape[:-1] + (FP8_TOKEN_BYTES,), dtype=torch.uint8, device=kv.device)
    out[..., :D_V] = values.view(torch.uint8).flatten(-2)
    out[..., D_V : D_V + 16] = scale.contiguous().view(torch.uint8)
    out[..., D_V + 16 :] = kv[..., D_V:].contiguous().view(torch.uint8)
    return out


def dequantize_fp8(tokens: torch.Tensor) -> torch.Tensor:
    """656-byte tokens [..., 656] uint8 -> [..., 576] as float64 holding the bf16 values the
    kernels compute with: float(e4m3) * scale in float32, rounded to bf16 (docs/contract.md's
    dequantization, as mlakit's dequantize tool and both libraries' kernels do)."""
    values = tokens[..., :D_V].contiguous().view(torch.float8_e4m3fn).float().unflatten(-1, (4, 128))
    scale = tokens[..., D_V : D_V + 16].contiguous().view(torch.float32)
    rope = tokens[..., D_V + 16 :].contiguous().view(torch.bfloat16)
    nope = (values * scale[..., None]).flatten(-2).to(torch.bfloat16)
    return torch.cat([nope, rope], dim=-1).double()


def _distinct(rows: int, n: int, k: int, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """[rows, k] distinct values of [0, n) per row, in random order (the top k of random keys)."""
    chunks = []
    for first in range(0, rows, INDEX_CHUNK_ROWS):
        count = min(INDEX_CHUNK_ROWS, rows - first)
        keys = torch.rand((count, n), device=device, generator=gen)
        chunks.append(keys.topk(k, dim=-1, sorted=False).indices)
    picked = torch.cat(chunks)
    order = torch.rand(picked.shape, device=device, generator=gen).argsort(dim=-1)
    return picked.gather(-1, order)


def sparse_decode(p: Dict[str, Any], seed: int, device: torch.device) -> Inputs:
    host, dev = _generators(seed, device)
    b, s_q, h_q, topk, s_k, page = p["b"], p["s_q"], p["h_q"], p["topk"], p["s_k"], p["page"]
    blocks_per_seq = s_k // page
    block_table = _shuffled_block_table(b, blocks_per_seq, host).to(device).long()
    num_tokens = b * s_k
    cache = torch.empty((num_tokens, FP8_TOKEN_BYTES), dtype=torch.uint8, device=device)
    chunk = 1 << 20  # tokens quantized at once (bf16 staging + float32 temporaries ~3.5 GB)
    for first in range(0, num_tokens, chunk):
        count = min(chunk, num_tokens - first)
        cache[first : first + count] = quantize_fp8(_cache_values((count, D_QK), device, dev))
    logical = _distinct(b * s_q, s_k, topk, device, dev).view(b, s_q, topk)
    batch = torch.arange(b, device=device)[:, None, None]
    slots = block_table[batch, logical // page] * page + logical % page
    listed = torch.zeros(num_tokens, dtype=torch.bool, device=device)
    listed[slots.flatten()] = True
    cache[~listed] = 0xFF
    q = _normal((b, s_q, h_q, D_QK), torch.bfloat16, device, dev)
    info = dict(
        seed=seed,
        mean_s_k=float(s_k),
        flops=float(b * s_q * h_q * (2 * D_QK + 2 * D_V) * topk),
        bytes=float(b * s_q * (h_q * (D_QK + D_V) * 2 + topk * FP8_TOKEN_BYTES)),
    )
    # block_table: not an argument of the sparse decode (indices are slots), kept for the checks.
    tensors = dict(q=q, k_cache=cache.view(b * blocks_per_seq, page, 1, FP8_TOKEN_BYTES), indices=slots.to(torch.int32),
                   block_table=block_table.to(torch.int32))
    return Inputs(tensors, info)


def quantize_fp8_v4(kv: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """bf16 [..., 512] -> (records [..., 576], scale records [..., 8]) uint8 of the V4 cache:
    tile scale 2^ceil(log2(max(amax / 448, 1e-4))) (FlashMLA's rule, in PyTorch's float32
    log2), stored e4m3(x / scale), scale byte exponent + 127, the RoPE part as bf16 bytes."""
    nope = kv[..., :V4_NOPE].float().unflatten(-1, (V4_NOPE // V4_TILE, V4_TILE))
    exponent = torch.ceil(torch.log2((nope.abs().amax(-1) / E4M3_MAX).clamp(min=1e-4)))
    values = (nope / torch.exp2(exponent)[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    records = torch.empty(kv.shape[:-1] + (V4_RECORD,), dtype=torch.uint8, device=kv.device)
    records[..., :V4_NOPE] = values.view(torch.uint8).flatten(-2)
    records[..., V4_NOPE:] = kv[..., V4_NOPE:].contiguous().view(torch.uint8)
    scales = torch.zeros(kv.shape[:-1] + (8,), dtype=torch.uint8, device=kv.device)
    scales[..., :7] = (exponent + 127).to(torch.uint8)
    return records, scales


def dequantize_fp8_v4(records: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """V4 tokens (records [..., 576], scale records [..., 8]) -> [..., 512] float64 holding the
    bf16 values the kernels compute with (e4m3 times a power of two: exact)."""
    values = records[..., :V4_NOPE].contiguous().view(torch.float8_e4m3fn).double()
    scale = torch.exp2(scales[..., :7].double() - 127)
    nope = (values.unflatten(-1, (7, V4_TILE)) * scale[..., None]).flatten(-2)
    return torch.cat([nope, records[..., V4_NOPE:].contiguous().view(torch.bfloat16).double()], dim=-1)


def _v4_paged_cache(num_blocks: int, page: int, device: torch.device, dev: torch.Generator):
    """A V4 cache of random values: (k_cache [num_blocks, page, 1, 584] view, records
    [num_blocks, page, 576] and scales [num_blocks, page, 8] views of the same bytes)."""
    block_bytes = math.ceil(page * V4_TOKEN_BYTES / V4_RECORD) * V4_RECORD
    buffer = torch.full((num_blocks, block_bytes), 0xFF, dtype=torch.uint8, device=device)
    records = buffer[:, : page * V4_RECORD].view(num_blocks, page, V4_RECORD)
    scales = buffer[:, page * V4_RECORD : page * V4_TOKEN_BYTES].view(num_blocks, page, 8)
    chunk = max(1, (1 << 20) // page)  # blocks quantized at once
    for first in range(0, num_blocks, chunk):
        last = min(num_blocks, first + chunk)
        records[first:last], scales[first:last] = quantize_fp8_v4(_cache_values((last - first, page, V4_D_QK), device, dev))
    k_cache = buffer[:, : page * V4_TOKEN_BYTES].view(num_blocks, page, 1, V4_TOKEN_BYTES)
    return k_cache, records, scales


def _poison_unlisted_v4(records: torch.Tensor, scales: torch.Tensor, slots: torch.Tensor) -> None:
    listed = torch.zeros(records.shape[0] * records.shape[1], dtype=torch.bool, device=records.device)
    listed[slots.flatten().long()] = True
    unlisted = (~listed).view(records.shape[0], records.shape[1])
    records[unlisted] = 0xFF
    scales[unlisted] = 0xFF


def sparse_decode_v4(p: Dict[str, Any], seed: int, device: torch.device) -> Inputs:
    host, dev = _generators(seed, device)
    b, s_q, h_q, topk, page = p["b"], p["s_q"], p["h_q"], p["topk"], p["page"]
    lengths = torch.normal(float(p["s_k"]), p["s_k"] / 4, (b,), generator=host).floor().clamp(min=topk).long()
    blocks_per_seq = math.ceil(int(lengths.max()) / page)
    table = _shuffled_block_table(b, blocks_per_seq, host).long().to(device)
    k_cache, records, scales = _v4_paged_cache(b * blocks_per_seq, page, device, dev)
    # topk distinct positions below each sequence's length, per query token.
    keys = torch.rand((b, s_q, blocks_per_seq * page), device=device, generator=dev)
    past = torch.arange(blocks_per_seq * page, device=device)[None, None, :] >= lengths.to(device)[:, None, None]
    keys.masked_fill_(past, -1.0)
    logical = keys.topk(topk, dim=-1, sorted=False).indices
    logical = logical.gather(-1, torch.rand(logical.shape, device=device, generator=dev).argsort(dim=-1))
    batch = torch.arange(b, device=device)[:, None, None]
    indices = (table[batch, logical // page] * page + logical % page).to(torch.int32)
    _poison_unlisted_v4(records, scales, indices)
    tensors = dict(q=_normal((b, s_q, h_q, V4_D_QK), torch.bfloat16, device, dev), k_cache=k_cache,
                   records=records, scales=scales, indices=indices, extra_k_cache=None, extra_indices=None)
    extra_topk = p["extra_topk"]
    if extra_topk:
        extra_page = p["extra_page"]
        extra_blocks = math.ceil(extra_topk / extra_page)
        extra_table = _shuffled_block_table(b, extra_blocks, host).long().to(device)
        extra_cache, extra_records, extra_scales = _v4_paged_cache(b * extra_blocks, extra_page, device, dev)
        window = torch.arange(extra_topk, device=device)  # the window's tokens, every query token all of them
        extra_slots = extra_table[:, window // extra_page] * extra_page + window % extra_page  # [b, extra_topk]
        extra_indices = extra_slots[:, None, :].expand(b, s_q, extra_topk).contiguous().to(torch.int32)
        _poison_unlisted_v4(extra_records, extra_scales, extra_indices)
        tensors.update(extra_k_cache=extra_cache, extra_records=extra_records, extra_scales=extra_scales,
                       extra_indices=extra_indices)
    keys_per_token = topk + extra_topk
    info = dict(
        seed=seed,
        mean_s_k=float(lengths.double().mean()),
        flops=float(b * s_q * h_q * (2 * V4_D_QK + 2 * D_V) * keys_per_token),
        bytes=float(b * s_q * (h_q * (V4_D_QK + D_V) * 2 + keys_per_token * V4_TOKEN_BYTES)),
    )
    return Inputs(tensors, info)


def sparse_prefill(p: Dict[str, Any], seed: int, device: torch.device) -> Inputs:
    _, dev = _generators(seed, device)
    s_q, h_q, topk, s_kv = p["s_q"], p["h_q"], p["topk"], p["s_kv"]
    d_qk = p.get("d_qk", D_QK)
    window = min(p["window"], s_kv) if p["window"] > 0 else s_kv
    if window == s_kv:
        indices = _distinct(s_q, s_kv, topk, device, dev)
    else:
        near = round(0.9 * topk)
        recent = _distinct(s_q, window, near, device, dev) + (s_kv - window)
        older = _distinct(s_q, s_kv - window, topk - near, device, dev)
        both = torch.cat([recent, older], dim=-1)
        indices = both.gather(-1, torch.rand(both.shape, device=device, generator=dev).argsort(dim=-1))
    q = _normal((s_q, h_q, d_qk), torch.bfloat16, device, dev)
    kv = _normal((s_kv, 1, d_qk), torch.bfloat16, device, dev)
    info = dict(
        seed=seed,
        mean_s_k=float(topk),
        flops=float(2 * s_q * h_q * topk * (d_qk + D_V)),
        bytes=float(s_q * (h_q * (d_qk + D_V) * 2 + topk * d_qk * 2)),
    )
    tensors = dict(q=q, kv=kv, indices=indices.to(torch.int32).view(s_q, 1, topk), sm_scale=d_qk**-0.5)
    return Inputs(tensors, info)


INT8_MAX = 127.0
ROPE_THETA = 10000.0


def quantize_rows(x: torch.Tensor, kind: str):
    """Rows [..., d] -> (values int8 / float8_e4m3fn, scale [...] float32) by docs/contract.md
    (GQA decode): scale = max|x| / 127 (int8, rounded to nearest even) or / 448 (fp8,
    saturating); an all-zero row has scale 0 and stores zeros."""
    x = x.float()
    scale = x.abs().amax(-1) / (INT8_MAX if kind == "int8" else E4M3_MAX)
    y = torch.where(scale[..., None] > 0, x / scale[..., None], torch.zeros_like(x))
    if kind == "int8":
        return torch.round(y).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), scale
    return y.clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def dequantize_rows(values: torch.Tensor, scale: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """stored * scale in `dtype` (float64: exact)."""
    return values.to(dtype) * scale.to(dtype)[..., None]


def rope_neox(x: torch.Tensor, pos: int, theta: float = ROPE_THETA) -> torch.Tensor:
    """NeoX rotary embedding of x [..., d] at position `pos`, computed in x's dtype (float32
    or float64): pairs (c, c + d/2), angle pos * theta^(-2c/d)."""
    d = x.shape[-1]
    c = torch.arange(d // 2, dtype=torch.float64, device=x.device)
    angle = pos * theta ** (-2.0 * c / d)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def gqa(p: Dict[str, Any], seed: int, device: torch.device) -> Inputs:
    host, dev = _generators(seed, device)
    b, s_q, h_q, h_kv, s_k, d, page = p["b"], p["s_q"], p["h_q"], p["h_kv"], p["s_k"], p["d"], p["page"]
    blocks = math.ceil(s_k / page)
    table = _shuffled_block_table(b, blocks, host).to(device)
    slots = table.flatten().long()

    def paged(x: torch.Tensor) -> torch.Tensor:  # [b, h_kv, s_k, d] -> [b * blocks, page, h_kv, d]
        out = torch.empty((b * blocks, page, h_kv, d), dtype=x.dtype, device=device)
        out[slots] = x.view(b, h_kv, blocks, page, d).permute(0, 2, 3, 1, 4).reshape(b * blocks, page, h_kv, d)
        return out

    def unpaged(x: torch.Tensor) -> torch.Tensor:  # the inverse
        return x[slots].view(b, blocks, page, h_kv, d).permute(0, 3, 1, 2, 4).reshape(b, h_kv, s_k, d).contiguous()

    tensors: Dict[str, Any] = dict(cache_seqlens=torch.full((b,), s_k, dtype=torch.int32, device=device),
                                   block_table=table, k_scale=None, v_scale=None, k_new=None, v_new=None)
    for name in ("k", "v"):
        contiguous = _cache_values((b, h_kv, s_k, d), device, dev)
        values = paged(contiguous)
        if p["cache"] != "bf16":
            values, scale = quantize_rows(values, p["cache"])
            tensors[f"{name}_scale"] = scale
            contiguous = unpaged(dequantize_rows(values, scale, torch.float32).to(torch.bfloat16))
        tensors[f"{name}_cache"] = values
        tensors[f"{name}_sdpa"] = contiguous  # [b, h_kv, s_k, d]
    tensors["q"] = _normal((b, s_q, h_q, d), torch.bfloat16, device, dev)
    if p["append"]:
        tensors["k_new"] = _cache_values((b, s_q, h_kv, d), device, dev)
        tensors["v_new"] = _cache_values((b, s_q, h_kv, d), device, dev)
    value_bytes = tensors["k_cache"].element_size()
    kv_bytes = 2.0 * b * h_kv * s_k * d
    side_bytes = dict(sdpa_cudnn=kv_bytes * 2, sdpa_flash=kv_bytes * 2,
                      mlakit=kv_bytes * value_bytes + (2.0 * b * s_k * h_kv * 4 if p["cache"] != "bf16" else 0.0))
    info = dict(
        seed=seed,
        mean_s_k=float(s_k),
        flops=4.0 * b * s_q * h_q * s_k * d,
        bytes=side_bytes["mlakit"],  # K + V (+ scales) read; side_bytes per side
        side_bytes=side_bytes,
        tokens=float(b * s_q),
    )
    return Inputs(tensors, info)


def sdpa_mha(p: Dict[str, Any], seed: int, device: torch.device) -> Inputs:
    _, dev = _generators(seed, device)
    b, h, s, d = p["b"], p["h"], p["s"], p["d"]
    q, k, v = (_normal((b, h, s, d), torch.bfloat16, device, dev) for _ in range(3))
    flops = 4.0 * b * h * s * s * d / (2 if p["causal"] else 1)
    info = dict(seed=seed, mean_s_k=float(s), flops=flops, bytes=float(4 * b * h * s * d * 2))
    return Inputs(dict(q=q, k=k, v=v, causal=p["causal"]), info)


def varlen_lengths(tokens: int, min_s: int, max_s: int, seed: int) -> List[int]:
    """Sequence lengths in [min_s, max_s] summing to exactly `tokens`, from a CPU generator
    seeded with `seed` (the same list on every device). While more than max_s tokens are left,
    a length log-uniform within one third of [min_s, max_s] on a log scale (short, middle,
    long: the thirds taken in a shuffled order, again after all three, so every mix has each),
    at most left - min_s (room for one more sequence); then the rest as the last length; the
    list shuffled (the rest not always last)."""
    if not (min_s <= tokens and 2 * min_s <= max_s):
        raise ValueError(f"varlen_lengths: cannot split {tokens} tokens into lengths in [{min_s}, {max_s}]")
    gen = torch.Generator().manual_seed(seed)
    lengths: List[int] = []
    thirds: List[int] = []
    left = tokens
    while left > max_s:
        thirds = thirds or torch.randperm(3, generator=gen).tolist()
        u = (thirds.pop() + float(torch.rand((), generator=gen, dtype=torch.float64))) / 3
        lengths.append(min(left - min_s, math.floor(min_s * (max_s / min_s) ** u)))
        left -= lengths[-1]
    lengths.append(left)
    return [lengths[i] for i in torch.randperm(len(lengths), generator=gen).tolist()]


def attended_pairs(lengths: List[int], causal: bool) -> float:
    """(query, key) pairs a head attends, summed over sequences: L^2 each, halved for causal
    (FlashAttention's convention: L^2 / 2 for the exact L (L + 1) / 2 pairs)."""
    return sum(float(n) * n for n in lengths) / (2 if causal else 1)


def prefill_flops(lengths: List[int], h: int, d_qk: int, d_v: int, causal: bool, backward: bool = False) -> float:
    """FLOPs of the MHA prefill over the attended pairs of h query heads: the forward 2 * (d_qk +
    d_v) per pair (QK^T, PV); the backward 2 * (3 d_qk + 2 d_v) (S = QK^T again, dP = dO V^T,
    dV = P^T dO, dQ = dS K, dK = dS^T Q: 2.5x the forward at d_qk = d_v)."""
    per_pair = 2.0 * ((3 * d_qk + 2 * d_v) if backward else (d_qk + d_v))
    return per_pair * h * attended_pairs(lengths, causal)


def _values(shape: Tuple[int, ...], device: torch.device, dev: torch.Generator) -> torch.Tensor:
    """V (and the backward's dout) at a tenth of a standard normal, as the GPU tests draw it: a
    causal row that sees a few keys averages few values, and P rounded to 16 bits (every side
    does) then errs by ~2^-9 |v|, which the accuracy rule's abs 1e-3 covers at this scale, not
    at |v| ~ 3; the backward's dP = dO V^T and dV = P^T dO carry that rounding alike."""
    return (_normal(shape, torch.float32, device, dev) * 0.1).to(torch.bfloat16)


def mha_prefill(p: Dict[str, Any], seed: int, device: torch.device, backward: bool = False) -> Inputs:
    """q, k ~ N(0, 1), v ~ N(0, 1) / 10 (and for the backward dout ~ N(0, 1) / 10, drawn after
    them: the forward case's very q, k, v); h_q = p['h'] query heads over p.get('h_kv', h) kv
    heads."""
    _, dev = _generators(seed, device)
    h, d_qk, d_v = p["h"], p["d_qk"], p["d_v"]
    h_kv = p.get("h_kv", h)
    tensors: Dict[str, Any] = dict(causal=p["causal"], varlen=p["varlen"])
    if p["varlen"]:
        lengths = varlen_lengths(p["tokens"], p["min_s"], p["max_s"], seed)
        total = sum(lengths)
        tensors.update(q_rows=_normal((total, h, d_qk), torch.bfloat16, device, dev),
                       k_rows=_normal((total, h_kv, d_qk), torch.bfloat16, device, dev),
                       v_rows=_values((total, h_kv, d_v), device, dev))
        if backward:
            tensors["dout_rows"] = _values((total, h, d_v), device, dev)
    else:
        b, s = p["b"], p["s"]
        lengths = [s] * b
        q = _normal((b, h, s, d_qk), torch.bfloat16, device, dev)
        k = _normal((b, h_kv, s, d_qk), torch.bfloat16, device, dev)
        batched = dict(q=q, k=k, v=_values((b, h_kv, s, d_v), device, dev))
        if backward:
            batched["dout"] = _values((b, h, s, d_v), device, dev)
        for name, x in batched.items():  # [b, heads, s, d] for SDPA; the same values as rows [b * s, heads, d]
            tensors[name] = x
            tensors[name + "_rows"] = x.transpose(1, 2).reshape(b * s, x.shape[1], x.shape[-1]).contiguous()
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    tensors.update(lengths=lengths, max_seqlen=max(lengths), min_seqlen=min(lengths),
                   cu_seqlens=torch.tensor(starts, dtype=torch.int32, device=device))
    total = starts[-1]
    # Each tensor read or written once: q, k, v read and out written (the forward); the backward
    # reads q, k, v, out, dout and the float32 lse and writes dq, dk, dv (twice each row's size).
    rows_q, rows_kv = h * (d_qk + d_v), h_kv * (d_qk + d_v)
    elements = (rows_q + rows_kv) * (2 if backward else 1)
    info = dict(seed=seed, mean_s_k=total / len(lengths),
                flops=prefill_flops(lengths, h, d_qk, d_v, p["causal"], backward),
                bytes=float(total * (elements * 2 + (h * 4 if backward else 0))))
    return Inputs(tensors, info)


def mha_backward(p: Dict[str, Any], seed: int, device: torch.device) -> Inputs:
    return mha_prefill(p, seed, device, backward=True)


MERGE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def merge(p: Dict[str, Any], seed: int, device: torch.device) -> Inputs:
    _, dev = _generators(seed, device)
    n, rows, d = p["n"], tuple(p["rows"]), p["d"]
    in_dtype, out_dtype = MERGE_DTYPES[p["dtype"]], MERGE_DTYPES[p["out_dtype"]]
    o = (_normal((n, *rows, d), torch.float32, device, dev) / 4).to(in_dtype)
    if p["lse_layout"] == "decode":  # rows (b, s_q, h_q); memory [n, b, h_q, s_q]
        b, s_q, h_q = rows
        lse = (_normal((n, b, h_q, s_q), torch.float32, device, dev) * 3 + 4).transpose(2, 3)
    else:
        lse = _normal((n, *rows), torch.float32, device, dev) * 3 + 4
    count = math.prod(rows)
    info = dict(
        seed=seed,
        flops=2.0 * n * count * d,  # a multiply-add per state value
        # every state's o and lse read, out and out_lse written
        bytes=float(n * count * (d * in_dtype.itemsize + 4) + count * (d * out_dtype.itemsize + 4)),
        tokens=float(count // rows[-1]),  # rows but the heads
    )
    return Inputs(dict(o=o, lse=lse, out_dtype=out_dtype), info)


_GENERATORS = {
    "dense_decode": dense_decode,
    "sparse_decode": sparse_decode,
    "sparse_decode_v4": sparse_decode_v4,
    "sparse_prefill": sparse_prefill,
    "gqa": gqa,
    "sdpa_mha": sdpa_mha,
    "mha_prefill": mha_prefill,
    "mha_backward": mha_backward,
    "merge": merge,
}
