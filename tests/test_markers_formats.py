"""A rule's markers (text only the vendor's own code holds: BLIS's "libblis: ..." messages) are
read in every audited format and wherever the file sits: a Windows DLL (MinGW gcc), a macOS
dylib (clang-15 + ld64.lld-15, arm64), and an ELF library inside a container image (gcc; a
`docker save` archive, and an OCI layout with a gzip layer). The same words inside prose are
no marker in any of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import require_tool
from image_fixtures import docker_archive, layer_tar, oci_layout
from linkage_fixtures import run

from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions

# BLIS's bli_print_msg / bli_abort messages (frame/base/bli_error.c), no bli_ symbol anywhere
BLIS = r"""
extern int fk_log(const char *fmt, ...);
static void report(const char *msg, const char *file, unsigned long line) {
    fk_log("libblis: %s (line %lu):\n", file, line);
    fk_log("libblis: %s\n", msg);
}
int fk_solve(int n) { if (n < 0) report("negative", __FILE__, __LINE__); return n * 2; }
"""
PROSE = r"""
extern int fk_log(const char *fmt, ...);
int fk_solve(int n) { if (n < 0) fk_log("this is not libblis: it only says the word\n"); return n * 2; }
"""
# kept out of line, so the messages stay in the data: the log function reads only its address
LOG = r"""
extern const char *volatile fk_last;
const char *volatile fk_last;
__attribute__((noinline)) int fk_log(const char *fmt, ...) { fk_last = fmt; return 0; }
"""


def _pe(d: Path, name: str, src: str) -> Path:
    gcc = require_tool("x86_64-w64-mingw32-gcc")
    (d / f"{name}.c").write_text(src + LOG)
    run(gcc, "-shared", "-O1", "-s", "-o", d / f"{name}.dll", d / f"{name}.c")
    return d / f"{name}.dll"


def _macho(d: Path, name: str, src: str) -> Path:
    clang = require_tool("clang-15")
    require_tool("ld64.lld-15")
    (d / f"{name}.c").write_text(src + LOG)
    run(clang, "--target=arm64-apple-macos11", "-fuse-ld=lld", "-nostdlib", "-shared", "-O1", "-o",
        d / f"lib{name}.dylib", d / f"{name}.c", f"-Wl,-install_name,@rpath/lib{name}.dylib")
    return d / f"lib{name}.dylib"


def _image(d: Path, name: str, src: str, how: str | None) -> Path:
    gcc = require_tool("gcc")
    (d / f"{name}.c").write_text(src + LOG)
    so = d / f"lib{name}.so"
    run(gcc, "-shared", "-fPIC", "-O1", "-s", "-o", so, d / f"{name}.c")
    layer = layer_tar([("dir", "usr/"), ("dir", "usr/lib/"), ("file", f"usr/lib/lib{name}.so", so.read_bytes())])
    if how is None:
        return docker_archive(d / f"{name}-plain.tar", [layer])
    return oci_layout(d / f"{name}-{how}", [layer], how=how)


def _markers(path: Path) -> list[str]:
    report = check_paths([str(path)], load_policy(None), ResolveOptions())
    return [f.subject for r in report.files for f in r.findings if f.rule == "blas.blis" and f.kind == "static-string"]


BUILDERS = {"pe": _pe, "macho": _macho, "image": lambda d, n, s: _image(d, n, s, None),
            "image-gzip": lambda d, n, s: _image(d, n, s, "gzip")}


@pytest.mark.parametrize("where", sorted(BUILDERS))
def test_markers_are_found_in_every_format(tmp_path, where):
    found = _markers(BUILDERS[where](tmp_path, "blis", BLIS))
    assert found and set(found) <= {"libblis: %s (line %lu):\n", "libblis: %s\n"}


@pytest.mark.parametrize("where", sorted(BUILDERS))
def test_the_words_inside_prose_are_no_marker(tmp_path, where):
    assert _markers(BUILDERS[where](tmp_path, "prose", PROSE)) == []
