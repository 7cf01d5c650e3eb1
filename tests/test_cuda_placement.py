"""The public call flash_kernel.attention where users put it on a GPU: inside a CUDA graph capture,
on a non-default stream, and on the second GPU of a host (`cuda:1`). Each result is checked
against a float64 reference on fresh random inputs, with the output's memory poisoned (NaN)
before the kernel writes it, so an element left unwritten or computed from stale inputs fails.

Marker `gpu`: skipped where torch sees no CUDA device (CI); run on the device machine. The library
is the one the public call picks for the device (the build folder's sm_90a, sm_90 or sm_80).
"""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)"),
]

import flash_kernel  # noqa: E402

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
# (B, H, Nq, Nk, D, dtype): ragged tiles, Nq != Nk both ways, both tensor-core head dims.
CASES = [(2, 3, 1000, 77, 128, torch.bfloat16), (1, 4, 333, 1025, 64, torch.float16)]


def fresh(device, shape_q, shape_kv, dtype):
    """New random inputs (a seed from the OS, printed on failure through the assertion)."""
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(shape_q, device=device, dtype=dtype, generator=gen)
    k = torch.randn(shape_kv, device=device, dtype=dtype, generator=gen)
    v = torch.randn(shape_kv, device=device, dtype=dtype, generator=gen)
    return seed, q, k, v


def reference(q, k, v):
    """softmax(Q K^T / sqrt(D)) V in float64."""
    q, k, v = (t.double() for t in (q, k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(s, dim=-1), v)


def rel(out, ref) -> float:
    if not torch.isfinite(out).all():
        return float("inf")
    return (torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref)).item()


def poisoned_block(like):
    """Fill a block of `like`'s size with NaN on the current stream and free it: the caching
    allocator hands this block to the next allocation of that size on that stream, so the
    kernel's output starts as NaN. Returns its address (the test checks the output got it)."""
    p = torch.full_like(like, float("nan"))
    ptr = p.data_ptr()
    del p
    return ptr


@pytest.mark.parametrize("b,h,nq,nk,d,dtype", CASES)
def test_public_call_captured_in_a_cuda_graph(b, h, nq, nk, d, dtype):
    seed, q, k, v = fresh("cuda", (b, h, nq, d), (b, h, nk, d), dtype)
    flash_kernel.attention(q, k, v)  # warm-up outside capture (library lookup, argument checks)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_kernel.attention(q, k, v)
    path = flash_kernel.library_for("cuda").last_flash_path()
    assert path in (None, "wgmma", "mma_sync", "generic")  # the captured call was dispatched
    for _ in range(2):  # replays read what the static inputs hold now
        out.fill_(float("nan"))
        seed, q2, k2, v2 = fresh("cuda", q.shape, k.shape, dtype)
        q.copy_(q2)
        k.copy_(k2)
        v.copy_(v2)
        graph.replay()
        torch.cuda.synchronize()
        err = rel(out, reference(q2, k2, v2))
        assert err <= TOL[dtype], f"seed {seed}, path {path}: rel L2 {err:.3g}"


@pytest.mark.parametrize("b,h,nq,nk,d,dtype", CASES)
def test_public_call_on_a_non_default_stream(b, h, nq, nk, d, dtype):
    _, q, k, v = fresh("cuda", (b, h, nq, d), (b, h, nk, d), dtype)
    seed, q2, k2, v2 = fresh("cuda", q.shape, k.shape, dtype)
    flash_kernel.attention(q, k, v)  # the kind is checked and remembered: the call below skips the checks
    torch.cuda.synchronize()
    side = torch.cuda.Stream()  # non-blocking: no implicit order with the default stream
    with torch.cuda.stream(side):
        # The side stream is held up, then writes the inputs: only a kernel launched on this
        # stream (after the writes) reads them; one on the default stream would run first and
        # read the old values.
        torch.cuda._sleep(int(2e7))
        q.copy_(q2)
        k.copy_(k2)
        v.copy_(v2)
        ptr = poisoned_block(q)
        out = flash_kernel.attention(q, k, v)
    assert out.data_ptr() == ptr, "the output did not get the poisoned block"
    side.synchronize()
    err = rel(out, reference(q2, k2, v2))
    assert err <= TOL[dtype], f"seed {seed}: rel L2 {err:.3g}"


def test_public_call_on_the_second_gpu():
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"needs a second CUDA GPU: this host has {n}")
    current = torch.cuda.current_device()
    assert current == 0
    b, h, nq, nk, d, dtype = CASES[0]
    seed, q, k, v = fresh("cuda:1", (b, h, nq, d), (b, h, nk, d), dtype)
    flash_kernel.attention(q, k, v)  # the kind is checked and remembered: the call below skips the checks
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == current
    with torch.cuda.device(1):  # the allocator's block of device 1, poisoned on its current stream
        ptr = poisoned_block(q)
    out = flash_kernel.attention(q, k, v)
    assert out.device == torch.device("cuda:1") and out.data_ptr() == ptr
    assert torch.cuda.current_device() == current  # the call left the caller's device as it was
    torch.cuda.synchronize(1)
    err = rel(out, reference(q, k, v))
    assert err <= TOL[dtype], f"seed {seed}: rel L2 {err:.3g}"
