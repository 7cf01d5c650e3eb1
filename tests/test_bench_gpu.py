"""On a CUDA GPU only (skipped elsewhere): CUDA-event timing, a real out-of-memory backend being
skipped while the rest goes on, and parity of our CUDA library with poisoned outputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

from audit.evidence.bench import run_bench  # noqa: E402
from audit.evidence.parity import run_parity  # noqa: E402
from audit.evidence.presets import Shape  # noqa: E402
from audit.evidence.selection import Backend, Selection, library_path, select  # noqa: E402

MID = Shape(1, 4, 2000, 2000, 128, "mid")


def _sdpa(q, k, v, scale=None):
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def test_real_oom_is_skipped_and_the_next_backend_still_runs():
    def hog(q, k, v, scale=None):
        return torch.empty(1 << 46, dtype=torch.uint8, device=q.device)  # 64 TiB

    sel = Selection("candidate", "t", "cuda", Backend("candidate", _sdpa, False),
                    Backend("naive", hog, True), "")
    rep = run_bench(sel, [MID], "bf16", repeats=5, warmup=1, progress=False,
                    backends=("primary", "naive", "eager", "sdpa-flash"), capture_environment=False)
    by = {b.name: b for b in rep.shapes[0].backends}
    assert by["naive"].status == "skipped" and by["naive"].reason.startswith("out of memory")
    assert by["eager"].status == "ok" and by["sdpa-flash"].status == "ok"
    assert "cuda events" in rep.timer
    assert all(s > 0 for s in by["candidate"].summary.samples)


@pytest.mark.parametrize("target", ["sm_90", "sm_90-generic", "sm_80"])
def test_our_cuda_library_parity_with_poisoned_outputs(target):
    if not library_path(target).is_file():
        pytest.skip(f"{library_path(target)} not built")
    if target.startswith("sm_90") and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU")
    sel = select(target=target, device="cuda")
    shapes = [Shape(1, 3, 1000, 1000, 128), Shape(2, 2, 77, 300, 64)]
    rep = run_parity(sel, shapes, "bf16", capture_environment=False)
    assert len(rep.shapes) == len(shapes)  # else the loop below checks nothing
    for s in rep.shapes:
        assert s.poisoned and s.oracle_poisoned
    assert rep.passed, rep.failure_lines()
