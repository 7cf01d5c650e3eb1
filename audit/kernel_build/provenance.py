"""provenance.json: what was built, from which files, by which compiler, on which host.

Written beside each library (`DIR/<target>/provenance.json`, schema sovereign-audit.provenance/1).
Source digests cover every file under flash_kernel/ that the translation unit actually included,
taken from the compiler's own dependency output (-MD -MF), so a header nobody listed by hand
cannot change the object unnoticed.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from audit.files import sha256_file

PROVENANCE_SCHEMA = "sovereign-audit.provenance/1"
SOURCE_SUFFIXES = (".h", ".hpp", ".cuh", ".inc", ".hip", ".cpp", ".cu", ".cc")


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a make-style dependency file (gcc, clang and nvcc -MD output)."""
    joined = text.replace("\\\r\n", " ").replace("\\\n", " ")
    deps: list[str] = []
    for line in joined.splitlines():
        # "target: a b" (gcc/clang) or "target : a b" (nvcc); the first ':' ends the target
        cut = line.find(":")
        if cut < 0:
            continue
        rest = line[cut + 1:]
        token, i = "", 0
        while i < len(rest):
            c = rest[i]
            if c == "\\" and i + 1 < len(rest) and rest[i + 1] == " ":
                token += " "  # an escaped space inside a path
                i += 2
                continue
            if c.isspace():
                if token:
                    deps.append(token)
                token = ""
            else:
                token += c
            i += 1
        if token:
            deps.append(token)
    seen, out = set(), []
    for d in deps:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def tree_sources(root: Path, deps: list[str]) -> list[str]:
    """Of the compiler's dependencies, those inside root/flash_kernel/, as sorted relative paths."""
    base = (root / "flash_kernel").resolve()
    rel: set[str] = set()
    for d in deps:
        p = Path(d)
        p = (root / p) if not p.is_absolute() else p
        try:
            r = p.resolve()
            r.relative_to(base)
        except (OSError, ValueError):
            continue
        if r.is_file():
            rel.add(r.relative_to(root.resolve()).as_posix())
    return sorted(rel)


def scan_sources(root: Path) -> list[str]:
    """Fallback when no dependency output exists: every source-looking file under flash_kernel/src and include."""
    out = []
    for sub in ("flash_kernel/include", "flash_kernel/src"):
        for p in sorted((root / sub).rglob("*")):
            if p.is_file() and p.suffix in SOURCE_SUFFIXES:
                out.append(p.relative_to(root).as_posix())
    return out


def _os_release() -> str | None:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def host_info() -> dict:
    return {
        "hostname": socket.gethostname(),
        "kernel": f"{platform.system()} {platform.release()} {platform.version()}",
        "machine": platform.machine(),
        "distro": _os_release(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def git_info(root: Path) -> dict | None:
    """The checkout's commit, and whether flash_kernel/ differs from it (None outside git)."""
    if shutil.which("git") is None:
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
        if head.returncode != 0:
            return None
        st = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "flash_kernel"],
                            capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": head.stdout.strip(), "flash_kernel_dirty": bool(st.stdout.strip())}


@dataclass
class FileDigest:
    path: str
    sha256: str
    size: int


@dataclass
class Provenance:
    target: str
    kind: str
    command: list[str]  # the exact argv, run with cwd = source_root
    cwd: str
    env: dict[str, str]  # variables set for the compiler on top of the environment
    flags: list[str]
    compiler: dict  # Toolchain.to_dict()
    sources: list[FileDigest]
    sources_method: str  # "compiler-deps" (from -MD) or "scan"
    outputs: list[FileDigest]  # paths relative to the target folder
    host: dict
    started_at: str
    finished_at: str
    duration_s: float
    expected_flash_path: str
    note: str = ""
    git: dict | None = None
    tool_version: str = ""
    temp_output: str = ""  # the -o name in `command`, renamed to the library once complete
    package_note: dict | None = None  # the .note.package added to the library (package_note.py)
    schema: str = PROVENANCE_SCHEMA
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        return {"schema": d.pop("schema"), **d}


def digest(path: Path, name: str) -> FileDigest:
    return FileDigest(name, sha256_file(path), path.stat().st_size)
