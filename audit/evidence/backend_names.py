"""The names `bench --backend` takes, in timing order: here alone, so the command line's choices
and the bench module read one list (importing the bench module would load it for every command)."""

from __future__ import annotations

# torch's SDPA backends by our name -> their SDPBackend member
SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION"}
DEFAULT_BACKENDS = ("primary", "naive", "eager", *SDPA_BACKENDS)
FA4 = "fa4"  # FlashAttention-4: only when asked for (an optional install)
BACKEND_NAMES = (*DEFAULT_BACKENDS, FA4)
