"""FP8 caches written byte by byte in NumPy, and a float64 NumPy sparse decode over one or two
of them, for the sparse-decode tests of DeepSeek V4 tokens and the second cache (CPU and GPU).

The caches are not made by mlakit's quantizers: random float8 e4m3 codes, scales and bf16
RoPE values are placed where the layouts of docs/contract.md put them, and the keys the
reference attends to are decoded from those values here (the e4m3 table below is built from
the format's definition). Every byte a decode must not read is 0xFF: the last page block
(NaN codes, NaN scales), V4's unused eighth scale byte (a scale of 2^128) and its block
padding; V3.2's last block (NaN codes and float32 NaN scales)."""

import numpy as np

from numpy_cases import from_bf16, to_bf16

D_V = 512
V32_TOKEN, V32_D_QK = 656, 576
V4_TOKEN, V4_RECORD, V4_D_QK, V4_NOPE, V4_TILE = 584, 576, 512, 448, 64
POISON = 0xFF


def e4m3_table():
    """The 256 float8 e4m3 (fn) codes as float64: sign, 4 exponent bits (bias 7), 3 mantissa
    bits; exponent 0 subnormal (m / 8 * 2^-6); 0x7F and 0xFF NaN; no infinities."""
    values = np.empty(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent, mantissa = (code >> 3) & 0xF, code & 0x7
        if exponent == 0xF and mantissa == 0x7:
            values[code] = np.nan
        elif exponent == 0:
            values[code] = sign * mantissa / 8 * 2.0**-6
        else:
            values[code] = sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)
    return values


E4M3 = e4m3_table()
FINITE_CODES = np.array([c for c in range(256) if not np.isnan(E4M3[c])], dtype=np.uint8)


def aligned_bytes(shape, fill=POISON, alignment=16):
    """A uint8 array of `shape` filled with `fill`, its data `alignment`-byte aligned (V4
    caches are read in 16-byte pieces)."""
    n = int(np.prod(shape))
    raw = np.full(n + alignment, fill, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + n].reshape(shape)


def v4_block_stride(page):
    """FlashMLA's V4 block stride: page * 584 bytes rounded up to a multiple of 576."""
    return -(-page * V4_TOKEN // V4_RECORD) * V4_RECORD


def _codes(rng, shape):
    return FINITE_CODES[rng.integers(0, len(FINITE_CODES), size=shape)]


class Fp8Cache:
    """An FP8 cache of `num_blocks` blocks of `page` tokens, the last block poisoned.

    ``buffer``: the bytes ([num_blocks, block_stride] uint8, 16-byte aligned); ``view``: the
    cache as the decode takes it ([num_blocks, page, 1, token_bytes]); ``keys``: [num_blocks *
    page, d_qk] float64, the dequantized tokens by slot (NaN in the poisoned block);
    ``valid_tokens``: the slots before the poisoned block."""

    def __init__(self, buffer, view, keys, page):
        self.buffer, self.view, self.keys, self.page = buffer, view, keys, page
        self.num_blocks = view.shape[0]
        self.valid_tokens = (self.num_blocks - 1) * page

    def torch(self, device="cpu"):
        """The same cache as a PyTorch tensor on `device` (the block stride kept)."""
        import torch

        buffer = torch.from_numpy(self.buffer).to(device)
        strides = tuple(s // self.view.itemsize for s in self.view.strides)
        return buffer.as_strided(self.view.shape, strides)


def v4_cache(rng, num_blocks, page, scale_bytes=(115, 120), pad=True):
    """A DeepSeek V4 cache: each block holds `page` 576-byte records (448 e4m3 codes, 64 bf16
    RoPE values) then `page` 8-byte scale records (7 UE8M0 bytes, 2^(byte - 127), and one
    unused byte), padded to a multiple of 576 bytes when `pad` (FlashMLA's stride)."""
    stride = v4_block_stride(page) if pad else page * V4_TOKEN
    buffer = aligned_bytes((num_blocks, stride))
    codes = _codes(rng, (num_blocks, page, V4_NOPE))
    scales = rng.integers(scale_bytes[0], scale_bytes[1] + 1, size=(num_blocks, page, V4_NOPE // V4_TILE))
    rope = to_bf16(np.clip(rng.standard_normal((num_blocks, page, 64)) / 10, -1, 1))
    records = buffer[:, : page * V4_RECORD].reshape(num_blocks, page, V4_RECORD)
    records[..., :V4_NOPE] = codes
    records[..., V4_NOPE:] = rope.view(np.uint8).reshape(num_blocks, page, 128)
    scale_records = buffer[:, page * V4_RECORD : page * V4_TOKEN].reshape(num_blocks, page, 8)
    scale_records[..., :7] = scales.astype(np.uint8)  # [..., 7] stays 0xFF: never read
    buffer[-1] = POISON
    nope = E4M3[codes] * np.repeat(2.0 ** (scales - 127.0), V4_TILE, axis=-1)
    keys = np.concatenate([nope, from_bf16(rope)], axis=-1)
    keys[-1] = np.nan
    view = np.lib.stride_tricks.as_strided(buffer, (num_blocks, page, 1, V4_TOKEN), (stride, V4_TOKEN, V4_TOKEN, 1))
    return Fp8Cache(buffer, view, keys.reshape(-1, V4_D_QK), page)


def v32_cache(rng, num_blocks, page):
    """A DeepSeek V3.2 cache: 656-byte tokens of 512 e4m3 codes, 4 float32 tile scales (one per
    128 codes) and 64 bf16 RoPE values. Its keys are bf16 (code * scale rounded); V4's need no
    rounding (an e4m3 value times a power of two is a bf16 value)."""
    buffer = aligned_bytes((num_blocks, page * V32_TOKEN))
    tokens = buffer.reshape(num_blocks, page, V32_TOKEN)
    codes = _codes(rng, (num_blocks, page, 512))
    scales = (rng.uniform(0.5, 2.0, size=(num_blocks, page, 4)) / 448).astype(np.float32)
    rope = to_bf16(np.clip(rng.standard_normal((num_blocks, page, 64)) / 10, -1, 1))
    tokens[..., :512] = codes
    tokens[..., 512:528] = scales.view(np.uint8).reshape(num_blocks, page, 16)
    tokens[..., 528:] = rope.view(np.uint8).reshape(num_blocks, page, 128)
    buffer[-1] = POISON
    # Dequantized in float32 and rounded to bf16, as the decode computes (docs/contract.md).
    nope = from_bf16(to_bf16(E4M3[codes].astype(np.float32) * np.repeat(scales, 128, axis=-1)))
    keys = np.concatenate([nope, from_bf16(rope)], axis=-1)
    keys[-1] = np.nan
    return Fp8Cache(buffer, tokens.reshape(num_blocks, page, 1, V32_TOKEN), keys.reshape(-1, V32_D_QK), page)


def indices_into(rng, b, s_q, topk, cache, empty_row=True):
    """[b, s_q, topk] int32 slots of `cache`'s valid tokens with duplicates, -1 and
    out-of-range entries (none into the poisoned block); with `empty_row` the last query token
    of sequence 0 lists no valid slot."""
    idx = rng.integers(0, cache.valid_tokens, size=(b, s_q, topk)).astype(np.int32)
    idx[rng.random(idx.shape) < 0.1] = -1
    idx[rng.random(idx.shape) < 0.05] = cache.num_blocks * cache.page + 5
    if empty_row:
        idx[0, -1] = -1
    return idx


def lengths(rng, b, topk):
    """[b] int32 lengths in [0, topk], the first one topk (its empty row stays empty)."""
    n = rng.integers(0, topk + 1, size=b).astype(np.int32)
    n[0] = topk
    return n


def reference(q, lists, scale=None, sink=None):
    """Float64 sparse decode of q [b, s_q, h_q, d_qk] (bf16 bit patterns or floats) over the
    union of index lists, each ``(cache, indices [b, s_q, k], lengths [b] or None)``: one
    softmax over every valid listed token (duplicates twice), V the first 512 key values.
    Returns (out [b, s_q, h_q, 512], natural-log lse [b, h_q, s_q]); no token: 0 and +inf;
    the sink scales out by 1 / (1 + exp(sink - lse))."""
    q = from_bf16(q) if q.dtype == np.uint16 else np.asarray(q, dtype=np.float64)
    b, s_q, h_q, d_qk = q.shape
    scale = d_qk**-0.5 if scale is None else scale
    out = np.zeros((b, s_q, h_q, D_V))
    lse = np.full((b, h_q, s_q), np.inf)
    for i in range(b):
        for t in range(s_q):
            keys = []
            for cache, idx, n in lists:
                count = idx.shape[-1] if n is None else max(0, min(int(n[i]), idx.shape[-1]))
                keys += [cache.keys[k] for k in idx[i, t, :count] if 0 <= k < len(cache.keys)]
            if not keys:
                continue
            k = np.array(keys)
            z = q[i, t] @ k.T * scale
            m = z.max(axis=1, keepdims=True)
            w = np.exp(z - m)
            row_lse = m[:, 0] + np.log(w.sum(axis=1))
            o = (w @ k[:, :D_V]) / w.sum(axis=1, keepdims=True)
            if sink is not None:
                o *= (1 / (1 + np.exp(np.asarray(sink, np.float64) - row_lse)))[:, None]
            out[i, t], lse[i, :, t] = o, row_lse
    return out, lse


def queries(rng, b, s_q, h_q, d_qk):
    """q ~ N(0, 1) as bf16 bit patterns (FlashMLA's test distribution)."""
    return to_bf16(rng.standard_normal((b, s_q, h_q, d_qk)))


def split_case(rng, cache, idx, n, cut):
    """The second-cache form of one list: entries [:cut] stay in `cache`, entries [cut:] move
    to a new cache of another page size holding copies of the tokens they name (slots
    remapped; -1 and out-of-range entries kept invalid). Lengths split the same way. Returns
    (first indices, first lengths, second cache, second indices, second lengths)."""
    rest = idx[..., cut:]
    page = cache.page + 3
    moved = np.unique(rest[(rest >= 0) & (rest < cache.valid_tokens)])
    num_blocks = -(-max(len(moved), 1) // page) + 1
    other = copy_tokens(cache, moved, page, num_blocks, rng)
    new_slot = {int(s): int(p) for s, p in zip(moved, other.slots)}
    second = np.array([new_slot.get(int(s), -1) for s in rest.reshape(-1)], dtype=np.int32).reshape(rest.shape)
    first_n = None if n is None else np.minimum(n, cut).astype(np.int32)
    second_n = None if n is None else np.maximum(n - cut, 0).astype(np.int32)
    return np.ascontiguousarray(idx[..., :cut]), first_n, other, second, second_n


def copy_tokens(cache, slots, page, num_blocks, rng):
    """A cache of `page`-token blocks (same layout as `cache`, last block poisoned) holding the
    tokens of `cache` at `slots`, shuffled; ``.slots[j]`` is where slots[j] went."""
    token_bytes = cache.view.shape[-1]
    if token_bytes == V4_TOKEN:
        new = v4_cache(rng, num_blocks, page)
    else:
        new = v32_cache(rng, num_blocks, page)
    places = rng.permutation(new.valid_tokens)[: len(slots)]
    for src, dst in zip(slots, places):
        copy_token(cache, int(src), new, int(dst))
    new.slots = places
    return new


def copy_token(src, s, dst, d):
    """Token `s` of cache `src` into slot `d` of cache `dst` (same layout): its bytes and key."""
    if src.view.shape[-1] == V4_TOKEN:
        for offset, size in ((0, V4_RECORD), (V4_RECORD, 8)):
            _v4_bytes(dst, d, offset, size)[...] = _v4_bytes(src, s, offset, size)
    else:
        dst.view.reshape(-1, V32_TOKEN)[d] = src.view.reshape(-1, V32_TOKEN)[s]
    dst.keys[d] = src.keys[s]


def _v4_bytes(cache, slot, part_offset, size):
    """The record (part_offset 0, 576 bytes) or scale record (576, 8 bytes) of a V4 slot."""
    block, offset = divmod(slot, cache.page)
    start = (cache.page * V4_RECORD + offset * 8) if part_offset else offset * V4_RECORD
    return cache.buffer[block, start : start + size]
