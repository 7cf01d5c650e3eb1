"""Error metrics (cosine, relative L2, max abs/rel, NaN/Inf, PSNR), computed in float64 in chunks,
and the reference attentions: the float64 one parity trusts and the eager softmax(QK^T)V one.

torch is imported inside functions so importing this module stays cheap and side-effect free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Bytes of scores one chunk may hold: big shapes (N ~ 1e5) never materialise N x N at once.
CPU_SCORE_BUDGET = 512 << 20
GPU_SCORE_BUDGET = 4 << 30


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


@dataclass
class ErrorMetrics:
    """`a` (measured) against `b` (reference). Non-finite elements of `a` count in nan/inf and are
    taken as 0 in the other metrics, so a NaN never hides an error and the figures stay finite.

    max_rel is max |a-b| / max(|b|, 0.01 * rms(b) of that head): a plain |a-b|/|b| is dominated by
    the reference's values closest to zero and says nothing about the kernel.
    """

    numel: int
    cosine: float | None
    rel_l2: float | None
    max_abs: float | None
    max_rel: float | None
    mse: float | None
    nan: int
    inf: int
    ref_nonfinite: int = 0
    psnr_db: float | None = None

    @property
    def one_minus_cos(self) -> float | None:
        return None if self.cosine is None else 1.0 - self.cosine

    @property
    def nonfinite(self) -> int:
        return self.nan + self.inf

    def to_dict(self) -> dict:
        return {"numel": self.numel, "cosine": _finite_or_none(self.cosine),
                "one_minus_cos": _finite_or_none(self.one_minus_cos),
                "rel_l2": _finite_or_none(self.rel_l2), "max_abs": _finite_or_none(self.max_abs),
                "max_rel": _finite_or_none(self.max_rel), "mse": _finite_or_none(self.mse),
                "psnr_db": _finite_or_none(self.psnr_db), "nan": self.nan, "inf": self.inf,
                "ref_nonfinite": self.ref_nonfinite}


class ErrorAccumulator:
    """Sums over chunks, so the full tensors never need a float64 copy."""

    def __init__(self):
        self.numel = 0
        self.dot = self.aa = self.bb = self.dd = 0.0
        self.max_abs = self.max_rel = 0.0
        self.nan = self.inf = self.ref_nonfinite = 0
        self.b_min = math.inf
        self.b_max = -math.inf

    def update(self, a, b) -> None:
        import torch

        a = a.detach().reshape(-1).to(torch.float64)
        b = b.detach().reshape(-1).to(b.device, torch.float64)
        a = a.to(b.device)
        nan = torch.isnan(a)
        inf = torch.isinf(a)
        self.nan += int(nan.sum())
        self.inf += int(inf.sum())
        a = torch.where(nan | inf, torch.zeros_like(a), a)
        bad_b = ~torch.isfinite(b)
        self.ref_nonfinite += int(bad_b.sum())
        b = torch.where(bad_b, torch.zeros_like(b), b)
        d = a - b
        self.numel += a.numel()
        self.dot += float(torch.dot(a, b))
        self.aa += float(torch.dot(a, a))
        self.bb += float(torch.dot(b, b))
        self.dd += float(torch.dot(d, d))
        if a.numel():
            ad = d.abs()
            self.max_abs = max(self.max_abs, float(ad.max()))
            rms = math.sqrt(float(torch.dot(b, b)) / b.numel())
            floor = max(0.01 * rms, 1e-300)
            self.max_rel = max(self.max_rel, float((ad / b.abs().clamp_min(floor)).max()))
            self.b_min = min(self.b_min, float(b.min()))
            self.b_max = max(self.b_max, float(b.max()))

    def result(self, data_range: float | None = None) -> ErrorMetrics:
        if self.numel == 0:
            return ErrorMetrics(0, None, None, None, None, None, self.nan, self.inf,
                                self.ref_nonfinite)
        denom = math.sqrt(self.aa) * math.sqrt(self.bb)
        cosine = self.dot / denom if denom > 0 else (1.0 if self.dd == 0 else 0.0)
        cosine = max(-1.0, min(1.0, cosine))
        rel = math.sqrt(self.dd) / math.sqrt(self.bb) if self.bb > 0 else (
            0.0 if self.dd == 0 else math.inf)
        mse = self.dd / self.numel
        rng = data_range if data_range is not None else self.b_max - self.b_min
        psnr = (math.inf if mse == 0 else 10 * math.log10(rng * rng / mse)) if rng > 0 else None
        return ErrorMetrics(self.numel, cosine, rel, self.max_abs, self.max_rel, mse, self.nan,
                            self.inf, self.ref_nonfinite, psnr)


def compare(a, b, data_range: float | None = None, chunk: int = 1 << 24) -> ErrorMetrics:
    """Metrics of `a` against `b` (same number of elements), in float64 chunks of `chunk`."""
    if a.numel() != b.numel():
        raise ValueError(f"compare: {tuple(a.shape)} and {tuple(b.shape)} differ in size")
    acc = ErrorAccumulator()
    fa, fb = a.reshape(-1), b.reshape(-1)
    for i in range(0, fa.numel(), chunk):
        acc.update(fa[i:i + chunk], fb[i:i + chunk])
    return acc.result(data_range)


def default_scale(head_dim: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def _row_chunk(nq: int, nk: int, bytes_per_score: int, budget: int) -> int:
    return max(1, min(nq, budget // max(1, nk * bytes_per_score)))


def reference_head(q, k, v, scale: float, budget: int | None = None):
    """float64 softmax(scale q k^T) v of one head: q (Nq,D), k and v (Nk,D); in row chunks,
    on the tensors' device (float64 on the GPU when they are there)."""
    import torch

    if budget is None:
        budget = GPU_SCORE_BUDGET if q.is_cuda else CPU_SCORE_BUDGET
    k64 = k.to(torch.float64)
    v64 = v.to(torch.float64)
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    rows = _row_chunk(q.shape[0], k.shape[0], 8 * 2, budget)
    for i in range(0, q.shape[0], rows):
        s = (q[i:i + rows].to(torch.float64) @ k64.T) * scale
        out[i:i + rows] = torch.softmax(s, dim=-1) @ v64
        del s
    return out


def eager_attention(q, k, v, scale: float | None = None, budget: int | None = None,
                    precise: bool = False):
    """softmax(scale Q K^T) V over (B,H,N,D) tensors, chunked over heads and query rows so the
    score matrix fits in `budget` bytes.

    precise=False: as a framework user writes it (matmuls in the input dtype, softmax in fp32):
    the bench baseline. precise=True: scores, softmax and P V in fp32 like our naive pre-flash
    path: the oracle when that path cannot run (bf16 scores alone cost ~1e-5 of cosine).
    """
    import torch

    if budget is None:
        budget = _gpu_budget(q) if q.is_cuda else CPU_SCORE_BUDGET
    b, h, nq, d = q.shape
    nk = k.shape[2]
    sc = default_scale(d, scale)
    out = torch.empty_like(q)
    qf, kf, vf, of = (t.reshape(b * h, t.shape[2], d) for t in (q, k, v, out))
    work = torch.float32 if precise else q.dtype
    # bytes per score: S in `work`, the fp32 softmax, P in `work`
    per_score = 4 + 4 if precise else 2 * q.element_size() + 4
    heads = max(1, min(b * h, budget // max(1, nq * nk * per_score)))
    rows = nq if heads > 1 or nq * nk * per_score <= budget else _row_chunk(nq, nk, per_score, budget)
    for i in range(0, b * h, heads):
        kt = kf[i:i + heads].to(work).transpose(1, 2)
        vw = vf[i:i + heads].to(work)
        for r in range(0, nq, rows):
            s = torch.matmul(qf[i:i + heads, r:r + rows].to(work), kt)
            s.mul_(sc)
            p = torch.softmax(s, dim=-1, dtype=torch.float32)
            del s
            p = p.to(work)
            of[i:i + heads, r:r + rows] = torch.matmul(p, vw).to(q.dtype)
            del p
    return out


def _gpu_budget(q) -> int:
    import torch

    try:
        free, _ = torch.cuda.mem_get_info(q.device)
    except Exception:
        return GPU_SCORE_BUDGET
    return int(max(256 << 20, min(4 * GPU_SCORE_BUDGET, free // 4)))


def reference_compare(q, k, v, outputs: dict, scale: float | None = None,
                      budget: int | None = None) -> dict[str, ErrorMetrics]:
    """Each named output (B,H,Nq,D) against the float64 reference, one head at a time."""
    b, h, nq, d = q.shape
    sc = default_scale(d, scale)
    accs = {name: ErrorAccumulator() for name in outputs}
    for bi in range(b):
        for hi in range(h):
            ref = reference_head(q[bi, hi], k[bi, hi], v[bi, hi], sc, budget)
            for name, out in outputs.items():
                accs[name].update(out[bi, hi], ref)
            del ref
    return {name: acc.result() for name, acc in accs.items()}


def fmt_cosine(c: float | None) -> str:
    """0.999995 must never read as 1.0: eight decimals and 1-cos in scientific notation."""
    if c is None:
        return "n/a"
    return f"{c:.8f} (1-cos {1.0 - c:.1e})"


def fmt_num(x: float | None, spec: str = ".2e") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, spec)
