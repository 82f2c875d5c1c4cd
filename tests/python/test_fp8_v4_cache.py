"""The DeepSeek V4 FP8 cache tools (584 bytes per token): host (NumPy) arrays run the CPU
version; the GPU part (PyTorch tensors on CUDA, bit-identical to the CPU) is skipped without a
usable GPU."""

import numpy as np
import pytest

import mlakit
from numpy_cases import as_float, cache_values, to_bf16

TOKEN, RECORD, D = 584, 576, 512


def padded_stride(page):
    """FlashMLA's block stride: page * 584 bytes rounded up to a multiple of 576."""
    return -(-page * TOKEN // RECORD) * RECORD


def v4_tokens(rng, shape):
    """bf16 bit patterns: N(0, 1) / 10 values at several magnitudes per token, one zero tile."""
    x = cache_values(rng, shape) * 10.0 ** rng.integers(-6, 6, size=shape[:-1] + (1,))
    x[..., 64:128] = 0
    return to_bf16(x)


def records_and_scales(cache):
    """The [num_blocks, page, 576] records and [num_blocks, page, 8] scale records of a cache,
    read from its bytes by the layout's own arithmetic (not the library's)."""
    num_blocks, page = cache.shape[0], cache.shape[1]
    blocks = np.lib.stride_tricks.as_strided(cache, (num_blocks, page * TOKEN), (cache.strides[0], 1))
    return blocks[:, : page * RECORD].reshape(num_blocks, page, RECORD), blocks[:, page * RECORD :].reshape(num_blocks, page, 8)


def expected_scale_bytes(x):
    """UE8M0 bytes of the tiles of float tokens [..., 512]: 127 + ceil(log2(max(amax / 448,
    1e-4))), clamped to [-13, 127]."""
    amax = np.abs(x[..., :448]).reshape(x.shape[:-1] + (7, 64)).max(axis=-1)
    f, p = np.frexp(np.maximum(amax / 448.0, 1e-4))
    exponent = np.where(f == 0.5, p - 1, p)
    return (np.clip(exponent, -13, 127) + 127).astype(np.uint8)


@pytest.mark.parametrize("page", [1, 2, 61, 64, 69])
def test_quantize_returns_a_padded_view_and_the_layout(page):
    rng = np.random.default_rng(page)
    kv = v4_tokens(rng, (3, page, 1, D))
    cache = mlakit.quantize_fp8_v4_cache(kv)
    assert cache.shape == (3, page, 1, TOKEN) and cache.dtype == np.uint8
    assert cache.strides == (padded_stride(page), TOKEN, TOKEN, 1)
    assert padded_stride(64) == 37440 and mlakit._fp8_cache.v4_block_stride(page) == padded_stride(page)
    records, scales = records_and_scales(cache)
    x = as_float(kv)[:, :, 0]
    np.testing.assert_array_equal(scales[..., :7], expected_scale_bytes(x))
    assert np.all(scales[..., 7] == 0) and np.all(scales[..., 1] == 114)  # the zero tile: 2^-13
    np.testing.assert_array_equal(records[..., 448:].copy().view(np.uint16), kv[:, :, 0, 448:])
    base = np.lib.stride_tricks.as_strided(cache, (3, padded_stride(page)), (cache.strides[0], 1))
    assert np.all(base[:, page * TOKEN :] == 0)  # the padding: zero-filled, never written


def test_round_trip_within_half_an_e4m3_ulp_of_the_tile_scale():
    rng = np.random.default_rng(5)
    kv = v4_tokens(rng, (4, 64, 1, D))
    cache = mlakit.quantize_fp8_v4_cache(kv)
    back = mlakit.dequantize_fp8_v4_cache(cache)
    assert back.shape == (4, 64, 1, D)
    x, y = as_float(kv), as_float(back)
    scale = np.repeat(2.0 ** (records_and_scales(cache)[1][..., :7].astype(np.float64) - 127), 64, axis=-1)[:, :, None]
    assert np.all(np.abs(y[..., :448] - x[..., :448]) <= np.maximum(np.abs(x[..., :448]) / 16, scale / 1024))
    np.testing.assert_array_equal(y[..., 448:], x[..., 448:])  # RoPE copied exactly
    np.testing.assert_array_equal(y[:, :, :, 64:128], 0)


def test_exact_codes_are_e4m3_of_x_over_the_scale():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(6)
    kv = v4_tokens(rng, (2, 16, D))  # the 3-d form
    cache = mlakit.quantize_fp8_v4_cache(kv)
    records, scales = records_and_scales(cache)
    scale = np.repeat(2.0 ** (scales[..., :7].astype(np.float64) - 127), 64, axis=-1)
    codes = (as_float(kv)[..., :448] / scale).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(records[..., :448], codes)


def test_append_writes_only_the_listed_slots_in_place():
    rng = np.random.default_rng(7)
    page, num_blocks = 5, 3
    cache = mlakit.quantize_fp8_v4_cache(v4_tokens(rng, (num_blocks, page, 1, D)))
    tokens = v4_tokens(rng, (5, D))
    slots = np.array([7, -1, 14, num_blocks * page, 0], dtype=np.int32)  # -1 and past-the-end: skipped
    before = cache.copy()
    mlakit.append_fp8_v4_cache(tokens, slots, cache)
    records, scales = records_and_scales(cache)
    old_records, old_scales = records_and_scales(before)
    # The written tokens: what quantizing them alone gives, at their slots.
    alone = mlakit.quantize_fp8_v4_cache(tokens[[0, 2, 4]].reshape(3, 1, 1, D))
    new_records, new_scales = records_and_scales(alone)
    expected_records, expected_scales = old_records.reshape(-1, RECORD).copy(), old_scales.reshape(-1, 8).copy()
    expected_records[[7, 14, 0]] = new_records.reshape(-1, RECORD)
    expected_scales[[7, 14, 0]] = new_scales.reshape(-1, 8)
    np.testing.assert_array_equal(records.reshape(-1, RECORD), expected_records)
    np.testing.assert_array_equal(scales.reshape(-1, 8), expected_scales)
    assert not np.array_equal(cache, before)


def test_an_unpadded_cache_and_empty_inputs():
    rng = np.random.default_rng(8)
    kv = v4_tokens(rng, (2, 4, 1, D))
    padded = mlakit.quantize_fp8_v4_cache(kv)
    tight = np.ascontiguousarray(padded)  # block stride 4 * 584: a multiple of 16
    np.testing.assert_array_equal(mlakit.dequantize_fp8_v4_cache(tight), mlakit.dequantize_fp8_v4_cache(padded))
    empty = mlakit.quantize_fp8_v4_cache(np.zeros((0, 64, 1, D), np.uint16))
    assert empty.shape == (0, 64, 1, TOKEN)
    assert mlakit.dequantize_fp8_v4_cache(empty).shape == (0, 64, 1, D)
    before = padded.copy()
    mlakit.append_fp8_v4_cache(np.zeros((0, D), np.uint16), np.zeros(0, np.int32), padded)
    np.testing.assert_array_equal(padded, before)


def test_errors_name_the_argument():
    rng = np.random.default_rng(9)
    kv = v4_tokens(rng, (2, 4, 1, D))
    cache = mlakit.quantize_fp8_v4_cache(kv)
    tokens, slots = kv[0, :, 0].copy(), np.array([0, 1, 2, -1], np.int32)
    with pytest.raises(TypeError, match=r"^quantize_fp8_v4_cache: kv: expected an array .*got None"):
        mlakit.quantize_fp8_v4_cache(None)
    with pytest.raises(ValueError, match=r"^quantize_fp8_v4_cache: kv: expected an array .* of 3 to 4 dimensions"):
        mlakit.quantize_fp8_v4_cache(kv[0, 0])
    with pytest.raises(ValueError, match=r"src\.shape\[3\] \(d_qk\): expected 512, got 576"):
        mlakit.quantize_fp8_v4_cache(np.zeros((2, 4, 1, 576), np.uint16))
    with pytest.raises(ValueError, match=r"src\.dtype: expected bf16"):
        mlakit.quantize_fp8_v4_cache(np.zeros((2, 4, 1, D), np.float32))
    with pytest.raises(ValueError, match=r"kv\.shape\[1\] \(page_size\): expected >= 1, got 0"):
        mlakit.quantize_fp8_v4_cache(np.zeros((2, 0, 1, D), np.uint16))
    with pytest.raises(ValueError, match=r"^dequantize_fp8_v4_cache: cache: expected a 4-d array"):
        mlakit.dequantize_fp8_v4_cache(cache[0])
    wide = np.zeros((2, 4, 1, 600), np.uint8)[..., :TOKEN]
    with pytest.raises(ValueError, match=r"src\.stride\[1\]: expected 584"):
        mlakit.dequantize_fp8_v4_cache(wide)
    with pytest.raises(ValueError, match=r"src\.shape\[3\] \(bytes per token\): expected 584, got 656"):
        mlakit.dequantize_fp8_v4_cache(np.zeros((2, 4, 1, 656), np.uint8))
    with pytest.raises(TypeError, match=r"^append_fp8_v4_cache: slots: expected an array .*got list"):
        mlakit.append_fp8_v4_cache(tokens, [0, 1, 2, -1], cache)
    with pytest.raises(ValueError, match=r"slots\.dtype: expected int32, got float32"):
        mlakit.append_fp8_v4_cache(tokens, slots.astype(np.float32), cache)
    with pytest.raises(ValueError, match=r"slots\.shape\[0\] \(n\): expected 4, got 3"):
        mlakit.append_fp8_v4_cache(tokens, slots[:3], cache)
    read_only = cache.copy()
    read_only.setflags(write=False)
    with pytest.raises(ValueError, match=r"^append_fp8_v4_cache: cache: expected a writable array"):
        mlakit.append_fp8_v4_cache(tokens, slots, read_only)


def _torch_on_gpu():
    torch = pytest.importorskip("torch")
    from torch_cases import require_gpu

    require_gpu()
    return torch


@pytest.mark.parametrize("page", [1, 61, 64, 69])
def test_gpu_tools_match_the_cpu_bit_for_bit(page):
    torch = _torch_on_gpu()
    rng = np.random.default_rng(20 + page)
    kv_host = torch.from_numpy(v4_tokens(rng, (6, page, 1, D)).view(np.int16)).view(torch.bfloat16)
    kv = kv_host.cuda()
    cache = mlakit.quantize_fp8_v4_cache(kv)
    assert cache.is_cuda and cache.dtype == torch.uint8 and cache.shape == (6, page, 1, TOKEN)
    assert cache.stride() == (padded_stride(page), TOKEN, TOKEN, 1)
    cpu = mlakit.quantize_fp8_v4_cache(kv_host)
    assert torch.equal(cache.cpu(), cpu)
    back = mlakit.dequantize_fp8_v4_cache(cache)
    assert back.is_cuda and back.dtype == torch.bfloat16
    assert torch.equal(back.cpu().view(torch.int16), mlakit.dequantize_fp8_v4_cache(cpu).view(torch.int16))

    tokens_host = torch.from_numpy(v4_tokens(rng, (4, D)).view(np.int16)).view(torch.bfloat16)
    slots_host = torch.tensor([3, -1, 6 * page, 6 * page - 1], dtype=torch.int32)
    mlakit.append_fp8_v4_cache(tokens_host.cuda(), slots_host.cuda(), cache)
    mlakit.append_fp8_v4_cache(tokens_host, slots_host, cpu)
    assert torch.equal(cache.cpu(), cpu)
