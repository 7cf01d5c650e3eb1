"""The typed report a run fills in: per-core runs, comparisons, the calibration, and METHOD."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from audit.evidence.consistency import TOLERANCE
from audit.evidence.pipeline.options import VAE_ROUNDS

SCHEMA = "sovereign-audit.pipeline/1"


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


@dataclass
class InstrumentedStep:
    """One CFG step with every swapped attention core call timed."""

    step_ms: float
    attention_calls: int
    attention_ms_total: float
    attention_ms_per_call_median: float
    attention_ms_per_call_mean: float
    attention_ms_samples: list[float] = field(default_factory=list)
    attention_ms_by_kind: dict[str, list[float]] = field(default_factory=dict)  # "self", "cross"

    @property
    def share(self) -> float:
        return self.attention_ms_total / self.step_ms if self.step_ms > 0 else float("nan")

    def to_dict(self) -> dict:
        return {"step_ms": _r(self.step_ms, 4), "attention_calls": self.attention_calls,
                "attention_ms_total": _r(self.attention_ms_total, 4),
                "attention_ms_per_call_median": _r(self.attention_ms_per_call_median, 5),
                "attention_ms_per_call_mean": _r(self.attention_ms_per_call_mean, 5),
                "attention_share": _r(self.share, 6),
                "attention_ms_samples": [_r(x, 5) for x in self.attention_ms_samples],
                "attention_ms_by_kind": {k: [_r(x, 5) for x in v] for k, v in self.attention_ms_by_kind.items()}}


@dataclass
class ModeRun:
    """One full generation with one attention core in every attn1."""

    attention: str
    sovereign: bool
    status: str = "ok"  # ok | skipped
    reason: str = ""
    step_s: list[float] = field(default_factory=list)
    dit_loop_s: float | None = None
    vae_decode_s: float | None = None  # median of the timed decodes
    vae_decode_samples_s: list[float] = field(default_factory=list)
    attention_calls: int = 0  # observed calls of the swapped processors during the loop
    instrumented: InstrumentedStep | None = None
    latents_nonfinite: int | None = None
    vae_reason: str = ""  # why the decode failed, when only it did

    @property
    def dit_plus_vae_s(self) -> float | None:
        if self.dit_loop_s is None or self.vae_decode_s is None:
            return None
        return self.dit_loop_s + self.vae_decode_s

    def to_dict(self) -> dict:
        step = None
        if self.step_s:
            from audit.evidence.stats import summarize

            step = summarize(self.step_s).to_dict()
        return {"attention": self.attention, "sovereign": self.sovereign, "status": self.status,
                "reason": self.reason, "dit_loop_s": _r(self.dit_loop_s, 4),
                "vae_decode_s": _r(self.vae_decode_s, 4), "vae_reason": self.vae_reason,
                "vae_decode_samples_s": [_r(x, 5) for x in self.vae_decode_samples_s],
                "dit_plus_vae_s": _r(self.dit_plus_vae_s, 4),
                "step_s": [_r(x, 5) for x in self.step_s], "step_summary_s": step,
                "attention_calls": self.attention_calls,
                "instrumented_step": self.instrumented.to_dict() if self.instrumented else None,
                "latents_nonfinite": self.latents_nonfinite}


@dataclass
class Comparison:
    """A core against the reference core (the first of --attention that ran)."""

    attention: str
    reference: str
    latents: dict | None = None  # metrics.ErrorMetrics.to_dict()
    frames: dict | None = None
    speedup_dit: float | None = None  # reference DiT loop / this one
    speedup_dit_ci: dict | None = None  # bootstrap CI of the ratio of loop times
    speedup_dit_vae: float | None = None
    speedup_dit_vae_ci: dict | None = None
    op_speedup: float | None = None  # s_op
    op_speedup_ci: dict | None = None  # bootstrap CI of the ratio of per-call medians
    reference_attention_share: float | None = None  # p
    amdahl_predicted: float | None = None
    amdahl_predicted_dit_vae: float | None = None  # the decode counted as unchanged time
    consistency: list[dict] = field(default_factory=list)  # consistency.Consistency.to_dict()

    def to_dict(self) -> dict:
        return {"attention": self.attention, "reference": self.reference,
                "latents": self.latents, "frames": self.frames,
                "speedup_dit_measured": _r(self.speedup_dit, 4), "speedup_dit_ci": self.speedup_dit_ci,
                "speedup_dit_vae_measured": _r(self.speedup_dit_vae, 4),
                "speedup_dit_vae_ci": self.speedup_dit_vae_ci,
                "op_speedup": _r(self.op_speedup, 4), "op_speedup_ci": self.op_speedup_ci,
                "reference_attention_share": _r(self.reference_attention_share, 6),
                "amdahl_predicted_dit": _r(self.amdahl_predicted, 4),
                "amdahl_predicted_dit_vae": _r(self.amdahl_predicted_dit_vae, 4),
                "consistency": list(self.consistency)}


@dataclass
class Calibration:
    """Latents of a run whose attention output carried seeded noise of `rel` * ||out||, against
    the same core's unperturbed latents."""

    attention: str
    rel: float
    seed: int
    status: str = "ok"
    reason: str = ""
    latents: dict | None = None

    def to_dict(self) -> dict:
        return {"attention": self.attention, "relative_perturbation": self.rel, "seed": self.seed,
                "status": self.status, "reason": self.reason, "latents": self.latents,
                "what": "Gaussian noise scaled to rel*||O|| (Frobenius, per call) added to every "
                        "swapped attention output; metrics of the perturbed final latents against "
                        "the unperturbed ones of the same core"}


METHOD = {
    "order": "every core warm before anything is timed (one untimed step each, then the "
             "instrumented steps); in the timed loop the cores take turns step by step, the first "
             "of each round rotating (AB, BA, ...), each with its own scheduler and latents",
    "dit_loop": "sum of per-step times; each step (two DiT passes for CFG, the CFG combine, the "
                "UniPC step) timed by perf_counter after torch.cuda.synchronize()",
    "vae_decode": "perf_counter after synchronize around vae.decode (latents de-normalised with "
                  "the VAE's latents_mean/std as WanPipeline does); one untimed decode of every "
                  f"core's latents first, then {VAE_ROUNDS} timed rounds in turns; the median counts",
    "attention_share": "a separate instrumented step (the first step, on a fresh scheduler): "
                       "each swapped attention core call (config.swap: self-attention, text "
                       "cross-attention) bracketed by CUDA events (perf_counter on CPU), the step "
                       "by a synchronised timer; share = sum(core) / step",
    "op_speedup": "median per-call core time of the reference / of the core, from the "
                  "instrumented steps (same shapes, same run), with a bootstrap 95% CI; with "
                  "self- and cross-attention swapped, the ratio of the step's summed core times "
                  "instead, each kind of call resampled on its own",
    "amdahl": "1 / ((1 - p) + p / s_op), p = the reference's attention share; for DiT+VAE the "
              "decode counts as unchanged time (p scaled by D / (D + V))",
    "consistency": "a measured speedup whose 95% CI lies apart from Amdahl's prediction (over the "
                   f"op speedup's CI) by more than {100 * TOLERANCE:.0f}% is inconsistent and not claimed "
                   "(audit.evidence.consistency)",
    "speedup_ci": "percentile bootstrap of the ratio of loop times (and of loop + decode times), "
                  "each core's samples resampled independently (audit.evidence.stats)",
    "parity": "final latents and decoded frames of each core against the reference core's, in "
              "float64 (audit.evidence.metrics.compare); frames PSNR with data range 2 (the "
              "decoder clamps to [-1, 1]); latents PSNR with the reference's max-min",
    "weights": "seeded default init of every module (nothing downloaded); fp32 init, then "
               "Linear/conv/attention weights cast to the run dtype except the modules in "
               "WanTransformer3DModel._keep_in_fp32_modules (kept fp32 as from_pretrained does)",
    "inputs": "text embeddings N(0,1) of umT5's shape (1,512,4096), a second set as the negative "
              "prompt; initial latents N(0,1), all from CPU generators (seed+1, seed+2, seed+3)",
}


@dataclass
class PipelineReport:
    preset: str
    config: dict
    versions: dict
    library: dict | None
    runs: list[ModeRun] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    calibration: Calibration | None = None
    environment: dict | None = None
    started: str = ""
    finished: str = ""
    complete: bool = False
    wall_s: float | None = None

    @property
    def reference(self) -> str | None:
        """The first core of --attention that ran; a later one stands in (and the report says
        so through reference != reference_requested) when the first failed."""
        return next((r.attention for r in self.runs if r.status == "ok"), None)

    @property
    def reference_requested(self) -> str:
        return self.config["attention"][0]

    def run(self, name: str) -> ModeRun | None:
        return next((r for r in self.runs if r.attention == name), None)

    def comparison(self, name: str) -> Comparison | None:
        return next((c for c in self.comparisons if c.attention == name), None)

    def failed_sovereign(self) -> list[ModeRun]:
        return [r for r in self.runs if r.sovereign and r.status != "ok"]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "preset": self.preset, "complete": self.complete,
                "started": self.started, "finished": self.finished, "wall_s": _r(self.wall_s, 3),
                "reference": self.reference, "reference_requested": self.reference_requested,
                "config": self.config, "versions": self.versions,
                "library": self.library, "method": METHOD,
                "runs": [r.to_dict() for r in self.runs],
                "comparisons": [c.to_dict() for c in self.comparisons],
                "calibration": self.calibration.to_dict() if self.calibration else None,
                "environment": self.environment}
