"""The attention swap of the video DiT: a processor for each block's attn1 (self-attention)
and, when cross-attention is swapped too, for its attn2.

`SwappedSelfAttnProcessor` computes what diffusers' `WanAttnProcessor` computes for
self-attention (QKV projections, RMS q/k norms, head split, RoPE, output projection), except the
attention core, which calls the selected function on (B,N,H,D) q, k, v after RoPE.
`SwappedCrossAttnProcessor` does the same for text cross-attention (q from the video tokens, k and
v from the text embeddings, no RoPE; Nq != Nk). With the "sdpa" core both are bit-identical to the
stock processor (tests/test_pipeline_swap.py checks it with torch.equal, and the pipeline checks it
again before any timing is trusted). What is not swapped is left exactly as it was.

Cores (`make_core`): "naive" = our library's pre-flash path, "flash" = our flash kernel,
"sdpa" = torch SDPA with its default dispatch (what stock diffusers runs), "sdpa-flash",
"sdpa-cudnn", "sdpa-efficient", "sdpa-math" = one SDPA backend forced (the vendor A/B, not
sovereign).

torch is imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from audit.errors import UsageError

SWAPS = ("self", "cross")  # which attention modules of every block get the core: attn1, attn2
FP8_CORE = "flash-fp8"  # our flash attention at precision="fp8" (flash_kernel.fp8)
OUR_CORES = ("naive", "flash", FP8_CORE)
SDPA_CORES = ("sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math")
CORES = OUR_CORES + SDPA_CORES
SOVEREIGN = {"naive": True, "flash": True, FP8_CORE: True}  # every SDPA core is a vendor path


def _sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
            "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa-math": SDPBackend.MATH}[name]


def parse_swap(spec) -> tuple[str, ...]:
    """'self,cross' -> ('self', 'cross'), in SWAPS order; a UsageError for anything else."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [str(s).strip() for s in items if str(s).strip()]
    if not names:
        raise UsageError("--swap needs self, cross or both (self,cross)")
    for n in names:
        if n not in SWAPS:
            raise UsageError(f"unknown --swap entry {n!r}; use self, cross or self,cross")
    if len(set(names)) != len(names):
        raise UsageError(f"--swap lists {','.join(names)}: an entry twice")
    return tuple(n for n in SWAPS if n in names)


def make_core(name: str, lib=None) -> Callable:
    """The attention core `fn(q, k, v) -> out`, all (B,N,H,D), out like q.

    `lib` is a loaded flash_kernel.Library, needed by "naive" and "flash" only.
    """
    import torch.nn.functional as F

    if name not in CORES:
        raise UsageError(f"unknown attention {name!r}; use one of {', '.join(CORES)}")
    if name == FP8_CORE:  # the opt-in FP8 numerics; refused where this build has no FP8 kernel
        from flash_kernel import fp8

        def core_fp8(q, k, v):
            return fp8.attention(q, k, v, layout="bnhd")

        return core_fp8
    if name in OUR_CORES:
        if lib is None:
            raise UsageError(f"attention {name!r} needs our kernel library (none was loaded)")
        fn = lib.naive_attention if name == "naive" else lib.attention

        def core(q, k, v):
            return fn(q, k, v, layout="bnhd")

        return core

    def sdpa(q, k, v):
        # Exactly diffusers' native backend: permute to (B,H,N,D), SDPA, permute back.
        q, k, v = (x.permute(0, 2, 1, 3) for x in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                             is_causal=False, scale=None, enable_gqa=False)
        return out.permute(0, 2, 1, 3)

    if name == "sdpa":
        return sdpa
    backend = _sdpa_backend(name)

    def forced(q, k, v):
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(backend):
            return sdpa(q, k, v)

    return forced


@dataclass
class CoreTimer:
    """Per-call time of the attention core. On CUDA: events on the current stream, read after
    one synchronize (no sync per call, so the timed pass runs as the untimed one does); on CPU:
    perf_counter around the call (CPU ops are synchronous). Each call is tagged with its kind
    ("self" or "cross"), kept in `kinds` beside `ms`."""

    enabled: bool = False
    _pending: list = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)

    def start(self, device):
        import torch

        if device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, device, token, kind: str = "self") -> None:
        import torch

        if device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((token, end, kind))
        else:
            self.ms.append((time.perf_counter() - token) * 1e3)
            self.kinds.append(kind)

    def collect(self) -> list[float]:
        """All per-call times so far in ms (synchronizes when CUDA events are pending)."""
        import torch

        if self._pending:
            torch.cuda.synchronize()
            self.ms.extend(s.elapsed_time(e) for s, e, _ in self._pending)
            self.kinds.extend(k for _, _, k in self._pending)
            self._pending.clear()
        return self.ms

    def by_kind(self) -> dict[str, list[float]]:
        """The collected per-call times split by kind, in SWAPS order (kinds with calls only)."""
        ms = self.collect()
        return {k: [m for m, t in zip(ms, self.kinds) if t == k] for k in SWAPS if k in self.kinds}

    def reset(self) -> None:
        self._pending.clear()
        self.ms = []
        self.kinds = []


@dataclass
class Perturbation:
    """Adds seeded Gaussian noise scaled to `rel * ||out||` (Frobenius, per call) to the core's
    output: the calibration of what a known attention error does to the latents."""

    rel: float
    seed: int
    _gen: object = None

    def apply(self, out):
        import torch

        if self._gen is None or self._gen.device != out.device:
            self._gen = torch.Generator(device=out.device)
            self._gen.manual_seed(self.seed)
        noise = torch.randn(out.shape, generator=self._gen, device=out.device, dtype=torch.float32)
        o32 = out.float()
        scale = self.rel * torch.linalg.vector_norm(o32) / torch.linalg.vector_norm(noise).clamp_min(1e-30)
        return (o32 + noise * scale).to(out.dtype)


def _apply_rotary_emb(x, freqs_cos, freqs_sin):
    # Same arithmetic as diffusers' WanAttnProcessor (pairs interleaved on the last dim), so the
    # type promotion (fp32/fp64 freqs) and rounding are identical.
    import torch

    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class _SwappedProcessor:
    """What the self- and cross-attention processors share: the core called on (B, N, H, D)
    heads, timed and counted, the optional perturbation, then the output projection."""

    kind = ""

    def __init__(self, core: Callable, name: str, timer: CoreTimer | None = None,
                 perturbation: Perturbation | None = None):
        self.core = core
        self.name = name
        self.timer = timer
        self.perturbation = perturbation
        self.calls = 0

    def _attend(self, attn, query, key, value, rotary_emb=None):
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            query = _apply_rotary_emb(query, *rotary_emb)
            key = _apply_rotary_emb(key, *rotary_emb)

        timed = self.timer is not None and self.timer.enabled
        if timed:
            token = self.timer.start(query.device)
        out = self.core(query, key, value)
        if timed:
            self.timer.stop(query.device, token, self.kind)
        self.calls += 1
        if self.perturbation is not None:
            out = self.perturbation.apply(out)

        out = out.flatten(2, 3).type_as(query)
        out = attn.to_out[0](out)
        out = attn.to_out[1](out)
        return out


class SwappedSelfAttnProcessor(_SwappedProcessor):
    """A drop-in processor for a WanAttention used as self-attention (attn1)."""

    kind = "self"

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None, **kwargs):
        if encoder_hidden_states is not None or attention_mask is not None or attn.add_k_proj is not None:
            # Only self-attention is swapped; anything else would silently change the model.
            raise RuntimeError("SwappedSelfAttnProcessor serves self-attention (attn1) only")
        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query = attn.to_q(hidden_states)
            key = attn.to_k(hidden_states)
            value = attn.to_v(hidden_states)
        return self._attend(attn, query, key, value, rotary_emb)


class SwappedCrossAttnProcessor(_SwappedProcessor):
    """A drop-in processor for a WanAttention used as text cross-attention (attn2): q from the
    video tokens, k and v from the text embeddings (Nq != Nk), no RoPE, no mask. The image
    branch of Wan's image-to-video models (add_k_proj) is not served: it raises."""

    kind = "cross"

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None, **kwargs):
        if encoder_hidden_states is None or attention_mask is not None or rotary_emb is not None \
                or attn.add_k_proj is not None:
            raise RuntimeError("SwappedCrossAttnProcessor serves text cross-attention (attn2) only")
        query = attn.to_q(hidden_states)
        if getattr(attn, "fused_projections", False):
            key, value = attn.to_kv(encoder_hidden_states).chunk(2, dim=-1)
        else:
            key = attn.to_k(encoder_hidden_states)
            value = attn.to_v(encoder_hidden_states)
        return self._attend(attn, query, key, value)


PROCESSORS = {"self": SwappedSelfAttnProcessor, "cross": SwappedCrossAttnProcessor}


def self_attention_modules(transformer) -> list:
    return [block.attn1 for block in transformer.blocks]


def attention_modules(transformer, kind: str) -> list:
    """Every block's attn1 ("self") or attn2 ("cross")."""
    return [block.attn1 if kind == "self" else block.attn2 for block in transformer.blocks]


def swap_attention(transformer, kind: str, processor_for: Callable[[int], object]) -> list:
    """Sets `processor_for(i)` on the attention of `kind` in blocks[i]; returns the previous ones."""
    before = []
    for i, attn in enumerate(attention_modules(transformer, kind)):
        before.append(attn.processor)
        attn.set_processor(processor_for(i))
    return before


def restore_attention(transformer, kind: str, processors: list) -> None:
    for attn, proc in zip(attention_modules(transformer, kind), processors):
        attn.set_processor(proc)


def swap_self_attention(transformer, processor_for: Callable[[int], object]) -> list:
    """Sets `processor_for(i)` on blocks[i].attn1; returns the previous attn1 processors.
    attn2 (cross-attention) is left exactly as it was."""
    return swap_attention(transformer, "self", processor_for)


def restore_self_attention(transformer, processors: list) -> None:
    restore_attention(transformer, "self", processors)
