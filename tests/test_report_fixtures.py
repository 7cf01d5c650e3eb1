"""Shared builders for the report/run/RO-Crate/escaping/browser tests (this module holds no tests).

Everything here is real: the bundle comes from the real `sovereign-audit run` on small CPU shapes
(built by the real compilers), the fixture libraries are compiled by gcc at test time.
Results are cached per test session (one `run` for every test file that needs it).
"""

from __future__ import annotations

import atexit
import functools
import html.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HOSTILE_SCRIPT = "<script>alert(1)</script>"
HOSTILE_IMG = '"><img src=x onerror=alert(1)>'
HOSTILE_FILE = HOSTILE_IMG + ".so"  # a file name cannot hold '/', so the <script> goes in its strings
RUN_TIMEOUT = 600

_tmp_root = Path(tempfile.mkdtemp(prefix="sa-report-tests-"))
atexit.register(shutil.rmtree, _tmp_root, ignore_errors=True)


def tmpdir(name: str) -> Path:
    p = _tmp_root / name
    p.mkdir(parents=True, exist_ok=True)
    return p


def cli(*args: str, timeout: int = RUN_TIMEOUT, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real command line, as a user runs it (`python3 -m audit ...` from the checkout)."""
    e = dict(os.environ)
    e.pop("SOVEREIGN_AUDIT_SIGNING_KEY", None)
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "audit", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=e)


@functools.cache
def cpu_run() -> tuple[Path, subprocess.CompletedProcess]:
    """One real run on this (GPU-less) machine: our cpu target (run) and sm_90 (built, never run)."""
    out = tmpdir("cpu-run") / "bundle"
    targets = ["--target", "cpu"]
    if shutil.which("nvcc"):
        targets += ["--target", "sm_90"]
    # A private build folder, seeded from the checkout's build/ (the builder reuses what its
    # provenance proves current): nothing else rebuilds it while this run audits it.
    build = tmpdir("build")
    for t in targets[1::2]:
        if (REPO / "build" / t).is_dir() and not (build / t).exists():
            shutil.copytree(REPO / "build" / t, build / t, ignore_dangling_symlinks=True)
    proc = cli("run", "--out", str(out), *targets, "--device", "cpu", "--pipeline-steps", "1",
               "--repeats", "6", "--build-dir", str(build))
    return out, proc


def require_cpu_run() -> Path:
    out, proc = cpu_run()
    if proc.returncode != 0 or not (out / "report.html").is_file():
        pytest.fail(f"the session's run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return out


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def gcc() -> str:
    path = shutil.which("gcc")
    if path is None:
        pytest.skip("gcc not on PATH (make test installs it)")
    return path


def compile_so(src: str, out: Path, *flags: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    c = out.parent / (out.name.replace("/", "_") + ".c")
    c = out.parent / "src.c" if any(ch in c.name for ch in "<>\"' ") else c
    c.write_text(src)
    subprocess.run([gcc(), "-shared", "-fPIC", "-O1", "-o", str(out), str(c), *flags], check=True,
                   capture_output=True, text=True, timeout=120)
    return out


HOSTILE_SRC = r"""
/* A harmless object whose strings carry markup: the report must show them as text. */
const char *fixture_banner = "%s";
const char *fixture_banner2 = "%s";
int fixture_probe(int x) { return x + 1; }
""" % (HOSTILE_SCRIPT.replace('"', '\\"'), HOSTILE_IMG.replace('"', '\\"'))


@functools.cache
def hostile_so() -> Path:
    """gcc-built .so named `"><img src=x onerror=alert(1)>.so`, embedding `<script>` strings."""
    return compile_so(HOSTILE_SRC, tmpdir("hostile") / HOSTILE_FILE)


@functools.cache
def openblas_so() -> Path:
    """A .so that links OpenBLAS: the sovereignty policy must fail it."""
    if subprocess.run(["sh", "-c", "ldconfig -p | grep -q libopenblas"], capture_output=True).returncode:
        pytest.skip("libopenblas not installed (make test installs libopenblas-dev)")
    src = "extern void cblas_sgemm(); void *use_blas(void) { return (void *)cblas_sgemm; }\n"
    return compile_so(src, tmpdir("openblas") / "libuses_blas.so", "-lopenblas")


# A plain-C implementation of our C ABI (fp32, head dims 64/128): flash and naive compute the same
# attention; with -DSKEW the flash output is scaled by 1.01, so the parity gate must fail.
ABI_SRC = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "flash_kernel.h"
static __thread const char *last = "";
int32_t fk_abi_version(void) { return FK_ABI_VERSION; }
const char *fk_target(void) { return "cpu"; }
const char *fk_flash_path(void) { return "cpu"; }
int32_t fk_supported_head_dims(int32_t *d, int32_t cap) {
    static const int32_t dims[2] = {64, 128};
    for (int i = 0; d && i < cap && i < 2; i++) d[i] = dims[i];
    return 2;
}
const char *fk_last_error(void) { return last; }
static int32_t attn(const fk_attention_args *a, float factor) {
    if (!a || !a->q || !a->k || !a->v || !a->o) { last = "null"; return FK_ERR_NULL_POINTER; }
    if (a->abi_version != FK_ABI_VERSION) { last = "abi"; return FK_ERR_ABI; }
    if (a->dtype != FK_DTYPE_F32) { last = "fp32 only"; return FK_ERR_DTYPE; }
    if (a->head_dim != 64 && a->head_dim != 128) { last = "head dim"; return FK_ERR_HEAD_DIM; }
    float scale = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)a->head_dim);
    float *s = malloc(sizeof(float) * a->nk);
    if (!s) { last = "oom"; return FK_ERR_NO_MEMORY; }
    const float *Q = a->q, *K = a->k, *V = a->v; float *O = a->o;
    for (int64_t b = 0; b < a->batch; b++) for (int64_t h = 0; h < a->heads; h++)
    for (int64_t i = 0; i < a->nq; i++) {
        const float *q = Q + b * a->q_stride[0] + h * a->q_stride[1] + i * a->q_stride[2];
        float m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < a->nk; j++) {
            const float *k = K + b * a->k_stride[0] + h * a->k_stride[1] + j * a->k_stride[2];
            float d = 0; for (int64_t x = 0; x < a->head_dim; x++) d += q[x] * k[x];
            s[j] = d * scale; if (s[j] > m) m = s[j];
        }
        for (int64_t j = 0; j < a->nk; j++) { s[j] = expf(s[j] - m); sum += s[j]; }
        float *o = O + b * a->o_stride[0] + h * a->o_stride[1] + i * a->o_stride[2];
        for (int64_t x = 0; x < a->head_dim; x++) {
            float acc = 0;
            for (int64_t j = 0; j < a->nk; j++)
                acc += s[j] * (V + b * a->v_stride[0] + h * a->v_stride[1] + j * a->v_stride[2])[x];
            o[x] = factor * acc / sum;
        }
    }
    free(s);
    return FK_OK;
}
#ifdef SKEW
#define FLASH_FACTOR 1.01f
#else
#define FLASH_FACTOR 1.0f
#endif
int32_t fk_flash_forward(const fk_attention_args *a) { return attn(a, FLASH_FACTOR); }
int32_t fk_naive_forward(const fk_attention_args *a) { return attn(a, 1.0f); }
"""


@functools.cache
def abi_so(skew: bool) -> Path:
    name = "libabi_skew.so" if skew else "libabi_good.so"
    flags = ["-I", str(REPO / "flash_kernel" / "include"), "-lm"] + (["-DSKEW"] if skew else [])
    return compile_so(ABI_SRC, tmpdir("abi-" + name) / name, *flags)


class TagCollector(html.parser.HTMLParser):
    """Every start tag and its attributes, as a browser's tokenizer sees them."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    handle_startendtag = handle_starttag

    def handle_data(self, data):
        self.text.append(data)


def parse_html(text: str) -> TagCollector:
    p = TagCollector()
    p.feed(text)
    p.close()
    return p


# The only elements report.html may contain: no script, img, iframe, object, link, form ...
ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "header", "footer", "section", "h1", "h2",
                "h3", "p", "div", "span", "strong", "code", "ul", "li", "table", "tr", "th", "td", "br",
                "figure", "figcaption", "svg", "g", "rect", "line", "text"}


def assert_inert(text: str) -> None:
    """No active content and nothing fetched: only allowed tags, no on* attributes, no URLs."""
    p = parse_html(text)
    bad_tags = sorted({t for t, _ in p.tags} - ALLOWED_TAGS)
    assert not bad_tags, f"unexpected elements in report.html: {bad_tags}"
    for tag, attrs in p.tags:
        for k, v in attrs.items():
            assert not k.startswith("on"), f"event handler attribute {k}= on <{tag}>"
            assert k not in ("src", "href", "srcset", "action", "formaction", "xlink:href", "background"), \
                f"<{tag} {k}={v!r}> would fetch or navigate"
            if k == "xmlns":
                continue
            assert "url(" not in (v or "").lower(), f"<{tag} {k}=...url(...)>"
    css = "".join(text.split("<style>")[1].split("</style>")[0]) if "<style>" in text else ""
    assert "@import" not in css and "url(" not in css
