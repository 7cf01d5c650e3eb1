"""bench --backend fa4: FlashAttention-4 as an optional A/B. Where it cannot run (no CUDA, fp32, not
installed) the row is skipped with why; where it imports, it is called on (B,N,H,D) views of the
same inputs and its output read back as (B,H,N,D). FlashAttention-4 itself needs a Hopper or
Blackwell GPU, so here a stand-in module with its call signature takes its place."""

from __future__ import annotations

import sys
import types

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from audit.evidence import fa4  # noqa: E402
from audit.evidence.bench import DEFAULT_BACKENDS, backends_for, run_bench  # noqa: E402
from audit.evidence.commands import render_vendor_table  # noqa: E402
from audit.evidence.presets import Shape  # noqa: E402
from audit.evidence.selection import Backend, Selection  # noqa: E402

SMALL = Shape(1, 3, 40, 24, 16, "small")


def _sel(device="cpu"):
    def sdpa(q, k, v, scale=None):
        return F.scaled_dot_product_attention(q, k, v, scale=scale)

    return Selection("candidate", "test", device, Backend("candidate", sdpa, False), None, "")


@pytest.fixture
def stand_in(monkeypatch):
    """A `flash_attn.cute` whose flash_attn_func computes attention on (B,N,H,D) as FA4 does and
    returns (out, lse); it records the layouts it was given."""
    seen = []

    def flash_attn_func(q, k, v, softmax_scale=None, **_):
        seen.append((tuple(q.shape), q.stride(-1)))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             scale=softmax_scale).transpose(1, 2)
        return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    pkg = types.ModuleType("flash_attn")
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = flash_attn_func
    pkg.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    fa4._load.cache_clear()
    yield seen
    fa4._load.cache_clear()


@pytest.fixture
def absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    fa4._load.cache_clear()
    yield
    fa4._load.cache_clear()


def test_fa4_is_not_timed_unless_asked_for():
    assert "fa4" not in DEFAULT_BACKENDS
    assert "fa4" not in [name for name, _ in backends_for(_sel(), 16, None, "bf16")]


def test_fa4_on_cpu_is_a_skipped_row_with_the_reason():
    rep = run_bench(_sel(), [SMALL], "fp32", repeats=2, warmup=1, backends=("primary", "fa4"),
                    progress=False, capture_environment=False)
    row = rep.shapes[0].backend("fa4")
    assert row.status == "skipped" and "CUDA GPUs only" in row.reason
    assert not row.sovereign and row.vendor
    assert rep.shapes[0].backend("candidate").summary is not None  # the rest still ran


def test_why_fa4_cannot_run(absent):
    assert "fp16 and bf16 only" in fa4.unavailable("cuda", "fp32")
    why = fa4.unavailable("cuda", "bf16")
    assert why.startswith("not installed: flash_attn.cute does not import") and "pip install flash-attn-4" in why
    assert fa4.unavailable("cpu", "bf16").startswith("FlashAttention-4 runs on CUDA GPUs only")


@pytest.mark.parametrize("bnhd", [False, True])
def test_fa4_gets_bnhd_views_and_its_output_is_read_back_as_bhnd(stand_in, bnhd):
    torch.manual_seed(0)
    if bnhd:  # stored (B,N,H,D), passed as a (B,H,N,D) view: FA4 then sees contiguous tensors
        q, k, v = (torch.randn(2, n, 3, 16).transpose(1, 2) for n in (40, 24, 24))
    else:
        q, k, v = (torch.randn(2, 3, n, 16) for n in (40, 24, 24))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.3)
    got = fa4.attention(q, k, v, scale=0.3)
    assert got.shape == (2, 3, 40, 16)
    assert torch.allclose(got.double(), want, atol=1e-5)
    assert stand_in[-1] == ((2, 40, 3, 16), 1)  # (B,N,H,D), no copy made: last stride still 1


def test_fa4_is_a_baseline_with_ratio_and_table_columns_when_it_runs(stand_in, monkeypatch):
    # the device check is the only thing between a CPU run and the stand-in: lift it for this run
    monkeypatch.setattr(fa4, "unavailable", lambda device, dtype: None)
    rep = run_bench(_sel(), [SMALL], "fp32", repeats=3, warmup=1, backends=("primary", "fa4"),
                    progress=False, capture_environment=False)
    sb = rep.shapes[0]
    assert sb.backend("fa4").status == "ok" and len(sb.backend("fa4").summary.samples) == 3
    assert any(s.baseline == "fa4" for s in sb.speedups)
    table = render_vendor_table(rep)
    assert "ours/FA4" in table.splitlines()[1]
    assert len(stand_in) == 4  # one warm-up and three timed calls


def test_the_table_has_no_fa4_columns_when_fa4_was_not_asked_for():
    rep = run_bench(_sel(), [SMALL], "fp32", repeats=2, warmup=1, backends=("primary",),
                    progress=False, capture_environment=False)
    assert "FA4" not in render_vendor_table(rep)


def test_a_skipped_fa4_row_says_why_in_the_table():
    rep = run_bench(_sel(), [SMALL], "fp32", repeats=2, warmup=1, backends=("primary", "fa4"),
                    progress=False, capture_environment=False)
    assert "fa4 skipped: FlashAttention-4 runs on CUDA GPUs only" in render_vendor_table(rep)
