"""Attention shapes: the real video DiT self-attention presets, small CPU presets, and parsing.

Plain data, no torch import: the pipeline, the report and `--help` can use it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

from audit.errors import UsageError


@dataclass(frozen=True)
class Shape:
    """One attention problem: Q is (B,H,Nq,D), K and V are (B,H,Nk,D)."""

    batch: int
    heads: int
    nq: int
    nk: int
    head_dim: int
    name: str = ""  # the preset it came from, "" for --shape

    @property
    def label(self) -> str:
        dims = (f"{self.batch},{self.heads},{self.nq},{self.head_dim}" if self.nq == self.nk
                else f"{self.batch},{self.heads},{self.nq},{self.nk},{self.head_dim}")
        return f"{self.name} ({dims})" if self.name else f"({dims})"

    @property
    def flops(self) -> int:
        # QK^T and PV: 2 matmuls of 2*Nq*Nk*D each, per (batch, head).
        return 4 * self.batch * self.heads * self.nq * self.nk * self.head_dim

    def numel_q(self) -> int:
        return self.batch * self.heads * self.nq * self.head_dim

    def numel_kv(self) -> int:
        return self.batch * self.heads * self.nk * self.head_dim

    def to_dict(self) -> dict:
        return {"name": self.name, "batch": self.batch, "heads": self.heads, "nq": self.nq,
                "nk": self.nk, "head_dim": self.head_dim, "label": self.label, "flops": self.flops}


def _p(name, b, h, nq, d, nk=None, about=""):
    return name, (Shape(b, h, nq, nq if nk is None else nk, d, name), about)


# name -> (shape, what it is). Video shapes: heads x head dim of each model's published config, N the
# tokens of its default resolution and frame count. Image shapes: the token counts of a 1024x1024
# image (4096 latent tokens) plus the model's text tokens, batch 2 where the two CFG passes are
# batched. Cross-attention: Nk = 512 umT5 text tokens.
PRESETS: dict[str, tuple[Shape, str]] = dict([
    _p("wan2.1-1.3b-480p", 1, 12, 32760, 128, about="Wan2.1-T2V-1.3B, 480x832, 81 frames"),
    _p("wan2.1-14b-480p", 1, 40, 32760, 128, about="Wan2.1-14B, 480p"),
    _p("wan2.1-14b-720p", 1, 40, 75600, 128, about="Wan2.1-14B, 720p"),
    _p("cogvideox-2b", 1, 30, 17776, 64, about="CogVideoX-2B, joint text+video"),
    _p("cogvideox-5b", 1, 48, 17776, 64, about="CogVideoX-5B, joint text+video"),
    _p("flux-1024", 1, 24, 4608, 128, about="Flux-class image DiT, 1024x1024 + 512 text tokens"),
    _p("sd3-1024", 2, 24, 4429, 64, about="SD3-class image DiT, 1024x1024 + 333 text tokens, CFG batch"),
    _p("short-ragged", 1, 16, 4173, 64, about="short sequence, no multiple of any tile"),
    _p("tokens-8k", 2, 24, 8192, 128, about="8k tokens, batch 2"),
    _p("tokens-2k-b8", 8, 16, 2048, 128, about="2k tokens, batch 8"),
    _p("wan2.1-1.3b-cross", 1, 12, 32760, 128, nk=512, about="Wan2.1-1.3B text cross-attention"),
    _p("wan2.1-14b-cross", 2, 40, 32760, 128, nk=512, about="Wan2.1-14B cross-attention, CFG batch"),
    _p("head-dim-32", 1, 16, 16384, 32, about="head dim 32"),
    _p("head-dim-72", 1, 16, 17550, 72, about="Open-Sora/PixArt-class head dim 72"),
    _p("head-dim-80", 1, 24, 16384, 80, about="head dim 80"),
    _p("head-dim-96", 1, 24, 16384, 96, about="head dim 96"),
    _p("head-dim-256", 1, 12, 16384, 256, about="head dim 256"),
    _p("hunyuanvideo-720p", 1, 24, 118800, 128, about="HunyuanVideo, 720p, 129 frames"),
    _p("mochi", 1, 24, 44776, 128, about="Mochi-1"),
    _p("ltx-video", 2, 32, 6144, 64, about="LTX-Video"),
    # Small presets that finish on a CPU in seconds; none is a multiple of the tile sizes.
    _p("tiny-128", 1, 2, 333, 128, about="CPU smoke test, head dim 128, ragged tiles"),
    _p("tiny-64", 2, 3, 257, 64, about="CPU smoke test, head dim 64, batch 2"),
    _p("tiny-cross", 1, 2, 77, 64, nk=300, about="CPU smoke test, Nq != Nk (cross-attention)"),
])

VIDEO_PRESETS = [n for n in PRESETS if not n.startswith("tiny")]
CPU_PRESETS = [n for n in PRESETS if n.startswith("tiny")]

# Named groups of presets (`--preset GROUP` takes them all, in this order): the diffusion
# transformer attention shapes, by kind, and all of them together.
PRESET_GROUPS: dict[str, tuple[str, ...]] = {
    "image": ("flux-1024", "sd3-1024", "short-ragged", "tokens-8k", "tokens-2k-b8"),
    "video": ("wan2.1-1.3b-480p", "wan2.1-14b-720p", "cogvideox-2b"),
    "cross": ("wan2.1-1.3b-cross", "wan2.1-14b-cross"),
    "head-dims": ("head-dim-32", "head-dim-72", "head-dim-80", "head-dim-96", "head-dim-256"),
}
PRESET_GROUPS["dit"] = PRESET_GROUPS["video"] + PRESET_GROUPS["image"] + PRESET_GROUPS["cross"] \
    + PRESET_GROUPS["head-dims"]
PRESET_GROUPS["tiny"] = tuple(CPU_PRESETS)


def preset(name: str) -> Shape:
    try:
        return PRESETS[name][0]
    except KeyError:
        raise UsageError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}; groups: "
                         f"{', '.join(PRESET_GROUPS)}") from None


def expand_preset(name: str) -> list[Shape]:
    """A preset or a group of presets by name."""
    if name in PRESET_GROUPS:
        return [preset(n) for n in PRESET_GROUPS[name]]
    return [preset(name)]


def about(shape: Shape) -> str:
    """What a preset's shape is ("" for a --shape)."""
    return PRESETS[shape.name][1] if shape.name in PRESETS else ""


def parse_shape(text: str) -> Shape:
    """`B,H,N,D` (self-attention) or `B,H,Nq,Nk,D` (cross-attention), positive integers."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (4, 5):
        raise UsageError(f"malformed shape {text!r}: expected B,H,N,D or B,H,Nq,Nk,D")
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        raise UsageError(f"malformed shape {text!r}: every dimension must be an integer") from None
    if any(v <= 0 for v in vals):
        raise UsageError(f"malformed shape {text!r}: every dimension must be >= 1")
    if any(v > 1 << 31 for v in vals):
        raise UsageError(f"malformed shape {text!r}: a dimension exceeds 2^31")
    if len(vals) == 4:
        b, h, n, d = vals
        return Shape(b, h, n, n, d)
    b, h, nq, nk, d = vals
    return Shape(b, h, nq, nk, d)


def resolve_shapes(shapes: tuple[str, ...] | list[str], presets: tuple[str, ...] | list[str],
                   default: list[str] | None = None) -> list[Shape]:
    """--shape and --preset values (presets or groups) in the order given (shapes first);
    `default` presets if none."""
    out = [parse_shape(s) for s in shapes] + [x for p in presets for x in expand_preset(p)]
    if not out:
        out = [preset(p) for p in (default or CPU_PRESETS)]
    return out

