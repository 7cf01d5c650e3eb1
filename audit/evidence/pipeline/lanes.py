"""The timed run's machinery: a lane per core, turns, the swap, the skip guard, decodes, calibration."""

from __future__ import annotations

from dataclasses import dataclass

from audit.errors import AuditError
from audit.evidence.dit_attention import (OUR_CORES, PROCESSORS, SWAPS, CoreTimer, Perturbation, make_core,
                                          restore_attention, swap_attention)
from audit.evidence.pipeline import generate
from audit.evidence.pipeline.compare import comparison_of
from audit.evidence.pipeline.parallel import cores_by_kind
from audit.evidence.pipeline.model import make_scheduler
from audit.evidence.pipeline.options import VAE_ROUNDS
from audit.evidence.pipeline.results import Calibration, ModeRun, PipelineReport


def reason_of(exc: BaseException, limit: int = 300) -> str:
    """A skipped core's reason: the exception on one line, at most `limit` characters."""
    s = " ".join(f"{type(exc).__name__}: {exc}".split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


@dataclass
class _Lane:
    """One core's state through the interleaved run."""

    run: ModeRun
    procs_by_kind: dict  # "self"/"cross" -> one processor per block
    sched: object = None
    latents: object = None

    @property
    def name(self) -> str:
        return self.run.attention

    @property
    def procs(self) -> list:
        return [p for procs in self.procs_by_kind.values() for p in procs]


def make_lanes(report: PipelineReport, names: list[str], library, timer: CoreTimer, layers: int,
               swap: tuple[str, ...], parallel_config=None) -> list[_Lane]:
    lanes = []
    for name in names:
        run = ModeRun(name, name in OUR_CORES)
        report.runs.append(run)
        try:
            cores = cores_by_kind(name, library, parallel_config, make_core)
        except (AuditError, KeyboardInterrupt):
            raise
        except Exception as exc:
            run.status, run.reason = "skipped", reason_of(exc)
            continue
        lanes.append(_Lane(run, {kind: [PROCESSORS[kind](cores[kind], name, timer) for _ in range(layers)]
                                 for kind in swap}))
    return lanes


def live(lanes: list[_Lane]) -> list[_Lane]:
    return [lane for lane in lanes if lane.run.status == "ok"]


def turns(items: list, i: int) -> list:
    """Round i's order: the list rotated by i (AB, BA, AB, ... for two)."""
    if not items:
        return []
    k = i % len(items)
    return items[k:] + items[:k]


def scheduler_at(steps: int, device):
    sched = make_scheduler()
    sched.set_timesteps(steps, device=device)
    sched.set_begin_index(0)
    return sched


class Swapper:
    """`with swapper(lane):` puts the lane's processors into every attention of the swapped kinds
    (attn1 for "self", attn2 for "cross") and restores the previous ones after; the kinds not
    swapped must stay diffusers' own."""

    def __init__(self, transformer, stock: dict, swap: tuple[str, ...]):
        self.transformer, self.stock, self.swap = transformer, stock, swap

    def __call__(self, lane: _Lane):
        import contextlib

        from audit.evidence.dit_attention import attention_modules

        @contextlib.contextmanager
        def swapped():
            before = {}
            try:
                for kind in self.swap:
                    before[kind] = swap_attention(self.transformer, kind,
                                                  lambda i, kind=kind: lane.procs_by_kind[kind][i])
                for kind in SWAPS:
                    if kind not in self.swap and any(
                            a.processor is not p for a, p in zip(attention_modules(self.transformer, kind),
                                                                 self.stock[kind])):
                        raise RuntimeError(f"{kind}-attention processors changed: the swap must touch "
                                           f"{', '.join(self.swap)} only")
                yield
            finally:
                for kind, procs in before.items():
                    restore_attention(self.transformer, kind, procs)

        return swapped()


class guard:
    """A core that fails (out of memory, a backend SDPA lacks, a kernel error) is recorded as
    skipped with its reason and leaves the run; the other cores go on."""

    def __init__(self, lane: _Lane, device, say):
        self.lane, self.device, self.say = lane, device, say

    def __enter__(self):
        return self.lane

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, (AuditError, KeyboardInterrupt)) or not isinstance(exc, Exception):
            return False
        run = self.lane.run
        run.status, run.reason = "skipped", reason_of(exc)
        self.say(f"{run.attention}: skipped: {run.reason}")
        self.lane.latents = self.lane.sched = None
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
        return True


def decode_all(report: PipelineReport, lanes: list[_Lane], vae, latents_of: dict, dev, say, metrics) -> None:
    import statistics

    import torch

    def failed(lane, exc):  # keep the DiT measurement when only the decode fails
        lane.run.vae_reason = reason_of(exc)
        say(f"{lane.name}: VAE decode failed: {lane.run.vae_reason}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    frames_ref, decoding = None, []
    for lane in lanes:  # untimed, each core's own latents: the warm-up and the parity's frames
        try:
            frames, _ = generate.decode(vae, latents_of[lane.name], dev)
        except Exception as exc:
            failed(lane, exc)
            continue
        decoding.append(lane)
        if lane.name == report.reference:
            frames_ref = frames
        elif frames_ref is not None:
            comparison_of(report, lane.name).frames = metrics.compare(frames, frames_ref, data_range=2.0).to_dict()
        del frames
    samples: dict[str, list[float]] = {lane.name: [] for lane in decoding}
    for r in range(VAE_ROUNDS):
        for lane in turns(decoding, r):
            if lane.run.vae_reason:
                continue
            try:
                frames, seconds = generate.decode(vae, latents_of[lane.name], dev)
                del frames
                samples[lane.name].append(seconds)
            except Exception as exc:
                failed(lane, exc)
    for lane in decoding:
        if not lane.run.vae_reason and samples[lane.name]:
            lane.run.vae_decode_samples_s = samples[lane.name]
            lane.run.vae_decode_s = statistics.median(samples[lane.name])


def run_calibration(report, transformer, inputs, steps, guidance, tdtype, dev, library, latents_of,
                    rel, seed, say, metrics, swap: tuple[str, ...] = ("self",), parallel_config=None) -> Calibration:
    """Re-runs one core with its attention output perturbed: the cheapest sovereign core that
    ran ("flash" if it did, else the reference)."""
    name = "flash" if "flash" in latents_of else report.reference
    cal = Calibration(name, rel, seed + 4)
    if name is None or name not in latents_of:
        cal.status, cal.reason = "skipped", "no core ran, so there is nothing to perturb"
        return cal
    perturb = Perturbation(rel, seed + 4)
    try:
        cores = cores_by_kind(name, library, parallel_config, make_core)
        before = {}
        try:
            for kind in swap:
                before[kind] = swap_attention(
                    transformer, kind, lambda i, kind=kind: PROCESSORS[kind](cores[kind], name, None, perturb))
            say(f"calibration: {name} with {rel:g} relative noise on the attention output")
            latents, _ = generate.denoise(transformer, inputs, steps, guidance, tdtype, dev)
        finally:
            for kind, procs in before.items():
                restore_attention(transformer, kind, procs)
        cal.latents = metrics.compare(latents, latents_of[name]).to_dict()
    except (AuditError, KeyboardInterrupt):
        raise
    except Exception as exc:
        cal.status, cal.reason = "skipped", reason_of(exc)
    return cal
