#!/usr/bin/env python3
"""Every output of `check` and `inspect` on ELF inputs, from a base revision's code and from the
current code, compared byte for byte; and the time of `check --format json` from each.

    python3 bench/elf_unchanged.py --base REV [--current REV] [--inputs PATH...] [--runs N]

The base revision is checked out with `git worktree` into a temporary folder (removed at the
end). The current code is this checkout's working tree, or another revision the same way
(--current). Each tree runs with its own code and its own shipped policy: the installed editable
finder is taken out of the import system, so `audit` and `audit.policies` come from that tree.

Outputs compared, per input: `check` with --format json, text, sarif, junit and github (one run,
each format to its own file), `check -v --format text`, `inspect`, `inspect --json`; the exit
code and stderr of each run too. With --policy base both trees read the base revision's
policies/sovereign.toml (one copy), so that what differs is the code's doing alone. The two trees run in the same process of this script, one after
the other for each output, the order alternating. Only what must differ is normalised: the
policy file's sha256 (when the two policy files differ) and the trees' own folder names. Timing
is off by default in `check` (the same input gives the same bytes), so no elapsed time is in the
outputs.

Default inputs are real binaries found on this machine (nothing is committed): torch's
libtorch_cpu.so and libtorch_python.so, numpy's _multiarray_umath*.so and numpy.libs/, a numpy
wheel (pip download into --cache), Debian's libopenblas.so.0, build/*/libflash_kernel.so,
tests/fixtures/device built with hipcc and nvcc (into --cache), and
docs/research-object-h200/artifacts/*/libflash_kernel.so. Exit 1 if any output differs.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Run `python3 -m audit` from TREE without the editable install's finder (it maps `audit` and
# `audit.policies` to the installed checkout whatever PYTHONPATH says).
BOOT = r"""
import runpy, sys
tree = sys.argv.pop(1)
sys.meta_path[:] = [f for f in sys.meta_path
                    if "__editable__" not in (getattr(f, "__module__", "") or "")
                    and "__editable__" not in type(f).__module__]
sys.path.insert(0, tree)
sys.argv[0] = "sovereign-audit"
runpy.run_module("audit", run_name="__main__", alter_sys=True)
"""

CHECK_FORMATS = ("json", "text", "sarif", "junit", "github")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


# ---------------------------------------------------------------- inputs

def default_inputs(cache: Path) -> list[Path]:
    found: list[Path] = []

    def add(p) -> None:
        p = Path(p)
        if p.exists() and p not in found:
            found.append(p)

    try:
        import torch  # noqa: F401 (only its folder)
        tlib = Path(torch.__file__).parent / "lib"
        add(tlib / "libtorch_cpu.so")
        add(tlib / "libtorch_python.so")
    except ImportError:
        log("torch not installed: its libraries are left out")
    try:
        import numpy
        npdir = Path(numpy.__file__).parent
        for so in sorted(glob.glob(str(npdir / "_core" / "_multiarray_umath*.so"))
                         + glob.glob(str(npdir / "core" / "_multiarray_umath*.so"))):
            add(so)
        add(npdir.parent / "numpy.libs")
        wheel = numpy_wheel(cache, numpy.__version__)
        if wheel:
            add(wheel)
    except ImportError:
        log("numpy not installed: its files are left out")
    add("/usr/lib/x86_64-linux-gnu/libopenblas.so.0")
    for so in sorted(glob.glob(str(REPO / "build" / "*" / "libflash_kernel.so"))):
        add(so)
    for so in build_fixtures(cache):
        add(so)
    for so in sorted(glob.glob(str(REPO / "docs" / "research-object-h200" / "artifacts" / "*"
                                   / "libflash_kernel.so"))):
        add(so)
    return found


def numpy_wheel(cache: Path, version: str) -> Path | None:
    have = sorted(cache.glob(f"numpy-{version}-*.whl"))
    if not have:
        cp = subprocess.run([sys.executable, "-m", "pip", "download", f"numpy=={version}", "--no-deps",
                             "--only-binary", ":all:", "-d", str(cache), "-q"],
                            capture_output=True, text=True)
        if cp.returncode:
            log(f"no numpy wheel (pip download: {cp.stderr.strip()[-200:]})")
        have = sorted(cache.glob(f"numpy-{version}-*.whl"))
    return have[0] if have else None


def build_fixtures(cache: Path) -> list[Path]:
    src = REPO / "tests" / "fixtures" / "device"
    out = []
    jobs = [("hipcc", cache / "libfk_probe_hip_gfx1030.so",
             ["--offload-arch=gfx1030", "-shared", "-fPIC", "-o", "{out}", str(src / "fk_probe.hip")]),
            ("nvcc", cache / "libfk_probe_cuda_sm90.so",
             ["-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-o", "{out}", str(src / "fk_probe.cu")])]
    for tool, so, args in jobs:
        exe = shutil.which(tool) or (f"/usr/local/cuda/bin/{tool}" if tool == "nvcc" else None)
        if not so.exists() and exe and os.path.exists(exe):
            env = dict(os.environ, HIP_PLATFORM="amd")  # hipcc picks NVIDIA when nvcc is on PATH
            cp = subprocess.run([exe, *[a.format(out=so) for a in args]], env=env,
                                capture_output=True, text=True)
            if cp.returncode:
                log(f"{tool} failed: {cp.stderr.strip()[-300:]}")
        if so.exists():
            out.append(so)
        else:
            log(f"{so.name}: not built ({tool} missing or failed)")
    return out


# ---------------------------------------------------------------- runs

class Tree:
    def __init__(self, label: str, root: Path, boot: Path, policy: Path | None = None):
        self.label, self.root, self.boot = label, root, boot
        self.policy_args = ["--policy", str(policy)] if policy else []
        pol = policy or root / "policies" / "sovereign.toml"
        self.policy_sha = hashlib.sha256(pol.read_bytes()).hexdigest() if pol.exists() else None

    def run(self, args: list[str], cwd: Path) -> tuple[int, bytes, bytes, float, float]:
        """(exit code, stdout, stderr, wall s, CPU s of the run and its forked workers)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GITHUB_", "PYTHONPATH", "SOVEREIGN_"))}
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        cp = subprocess.run([sys.executable, str(self.boot), str(self.root), *args], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
        return cp.returncode, cp.stdout, cp.stderr, wall, cpu


def outputs_of(tree: Tree, path: Path, work: Path) -> dict[str, bytes]:
    """Every output of one input from one tree: name -> bytes (exit code and stderr included)."""
    d = work / tree.label
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    res: dict[str, bytes] = {}
    specs = [f"--format={f}={d / ('check.' + f)}" for f in CHECK_FORMATS]
    rc, out, err, _, _ = tree.run(["check", *tree.policy_args, *specs, str(path)], d)
    for f in CHECK_FORMATS:
        p = d / f"check.{f}"
        res[f"check --format {f}"] = p.read_bytes() if p.exists() else b"<not written>"
    res["check (exit, stdout, stderr)"] = b"exit %d\n" % rc + out + b"\n--stderr--\n" + err
    for name, args in (("check -v --format text", ["check", "-v", "--format", "text"]),
                       ("inspect", ["inspect"]), ("inspect --json", ["inspect", "--json"])):
        rc, out, err, _, _ = tree.run([*args, *tree.policy_args, str(path)], d)
        res[name] = out
        res[name + " (exit, stderr)"] = b"exit %d\n" % rc + err
    return res


def normalise(data: bytes, tree: Tree, other: Tree) -> bytes:
    if tree.policy_sha and other.policy_sha and tree.policy_sha != other.policy_sha:
        data = data.replace(tree.policy_sha.encode(), b"<policy sha256>")
    return data.replace(str(tree.root).encode(), b"<tree>")


def first_diff(a: bytes, b: bytes, n: int = 14) -> str:
    al = a.decode("utf-8", "replace").splitlines()
    bl = b.decode("utf-8", "replace").splitlines()
    lines = list(difflib.unified_diff(al, bl, "base", "current", n=1, lineterm=""))
    cut = [ln if len(ln) <= 200 else ln[:200] + "..." for ln in lines[:n]]
    return "\n".join(cut) + (f"\n... ({len(lines) - n} more diff lines)" if len(lines) > n else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the revision to compare against")
    ap.add_argument("--current", help="a revision for the current side (default: this working tree)")
    ap.add_argument("--inputs", nargs="+", type=Path, help="ELF files, folders or wheels")
    ap.add_argument("--runs", type=int, default=5, help="timed runs of check --format json per tree")
    ap.add_argument("--policy", choices=("own", "base"), default="own",
                    help="own: each tree its shipped policy; base: both the base revision's")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "elf_unchanged-cache",
                    help="where built fixtures and the downloaded wheel are kept")
    a = ap.parse_args()

    a.cache.mkdir(parents=True, exist_ok=True)
    inputs = [p.resolve() for p in a.inputs] if a.inputs else default_inputs(a.cache)
    if not inputs:
        log("no inputs")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="elf_unchanged-"))
    boot = tmp / "boot.py"
    boot.write_text(BOOT)
    worktrees = []
    try:
        base_rev = git("rev-parse", "--short", a.base)
        git("worktree", "add", "--detach", str(tmp / "base"), a.base)
        worktrees.append(tmp / "base")
        policy = None
        if a.policy == "base":
            policy = tmp / "sovereign.toml"
            shutil.copyfile(tmp / "base" / "policies" / "sovereign.toml", policy)
        base = Tree("base", tmp / "base", boot, policy)
        if a.current:
            cur_rev = git("rev-parse", "--short", a.current)
            git("worktree", "add", "--detach", str(tmp / "current"), a.current)
            worktrees.append(tmp / "current")
            cur = Tree("current", tmp / "current", boot, policy)
        else:
            dirty = git("status", "--porcelain", "--", "audit", "policies")
            cur_rev = git("rev-parse", "--short", "HEAD") + (" + uncommitted audit/ changes" if dirty else "")
            cur = Tree("current", REPO, boot, policy)
        print(f"base {base_rev}, current {cur_rev}; policy sha256 "
              f"{'differs (normalised)' if base.policy_sha != cur.policy_sha else 'same'}"
              f"{' (both read the base policy)' if policy else ''}; "
              f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
        rows, timings, differ = [], [], 0
        for i, path in enumerate(inputs):
            log(f"[{i + 1}/{len(inputs)}] {path}")
            pair = (base, cur) if i % 2 == 0 else (cur, base)
            got = {t.label: outputs_of(t, path, tmp / "out") for t in pair}
            for name in got["base"]:
                b = normalise(got["base"][name], base, cur)
                c = normalise(got["current"][name], cur, base)
                same = b == c
                differ += not same
                rows.append((path, name, same, len(b), "" if same else first_diff(b, c)))
            wall = {"base": [], "current": []}
            cpu = {"base": [], "current": []}
            for r in range(a.runs):
                for t in (pair if r % 2 == 0 else pair[::-1]):
                    got_t = t.run(["check", *t.policy_args, "--format", "json", str(path)], tmp)
                    wall[t.label].append(got_t[3])
                    cpu[t.label].append(got_t[4])
            timings.append((path, *(statistics.median(d[k]) for d in (wall, cpu)
                                    for k in ("base", "current"))))
    finally:
        for w in worktrees:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(w)],
                           capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    def short(p: Path) -> str:
        s = str(p)
        return s.replace(str(REPO) + "/", "") if s.startswith(str(REPO)) else s

    print("\n| input | output | identical | bytes |\n|---|---|---|---:|")
    for path, name, same, n, _ in rows:
        print(f"| {short(path)} | {name} | {'yes' if same else '**no**'} | {n} |")
    for path, name, same, _, diff in rows:
        if not same:
            print(f"\n--- first difference: {short(path)}, {name}\n{diff}")
    print(f"\n`check --format json`, median of {a.runs} runs each, alternating (CPU: the run and "
          f"its forked workers, user + system):\n")
    print("| input | base wall s | current wall s | ratio | base CPU s | current CPU s | ratio |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for path, tb, tc, cb, cc in timings:
        print(f"| {short(path)} | {tb:.2f} | {tc:.2f} | {tc / tb:.2f} | {cb:.2f} | {cc:.2f} | {cc / cb:.2f} |")
    print(f"\n{differ} of {len(rows)} outputs differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
