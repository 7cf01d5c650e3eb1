"""What a finished report means for the exit status (the swap bit-exact, our cores ran)."""

from __future__ import annotations

from audit.errors import GateFailed
from audit.evidence.pipeline.results import PipelineReport


def check_outcome(report: PipelineReport) -> None:
    """GateFailed (exit 1) when one of our cores did not run or produced non-finite latents."""
    check = report.config.get("swap_check") or {}
    if not check.get("bit_exact", False):
        raise GateFailed("pipeline: the swapped processor with SDPA inside is not bit-identical to "
                         f"diffusers' stock processor (max abs diff {check.get('max_abs_diff')}); "
                         "its timings cannot be trusted")
    bad = [f"{r.attention} ({r.reason})" for r in report.failed_sovereign()]
    bad += [f"{r.attention} ({r.latents_nonfinite} non-finite latents)" for r in report.runs
            if r.status == "ok" and r.sovereign and r.latents_nonfinite]
    if bad:
        raise GateFailed("pipeline: our kernel's runs failed: " + "; ".join(bad))
