"""Real-wheel checks of how `check` finds vendor components that hide: renamed bundled libraries
and symbols (numpy, scipy), a dlopen of a library shipped beside the caller and a library name
assembled in code (onnxruntime-gpu), attention kernels in a vendoring project's namespace
(onnxruntime-gpu), and a NEEDED that only the wheel's other members satisfy (torch CPU).

Downloads the named wheels with pip into --cache (about 0.5 GB; torch's CPU wheel comes from
download.pytorch.org and is looked for there first), extracts the few members each check needs,
audits them with the default policy and prints one line per check: PASS or FAIL with what was
seen, or SKIP when a wheel cannot be had. Exit 1 if any check fails. Not a test: it needs the
network and minutes.

usage: python3 bench/discovery_wheels.py [--cache DIR]
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy

WHEELS = {  # name -> (pip requirement, platform tag, pip's extra arguments)
    "numpy": ("numpy==2.4.6", "manylinux_2_28_x86_64", []),
    "scipy": ("scipy==1.17.1", "manylinux_2_28_x86_64", []),
    "onnxruntime-gpu": ("onnxruntime-gpu==1.31.1", "manylinux_2_28_x86_64", []),
    "torch": ("torch==2.13.0", "manylinux_2_28_x86_64", ["--index-url", "https://download.pytorch.org/whl/cpu"]),
}
GLOBS = {"numpy": "numpy-2.4.6-*.whl", "scipy": "scipy-1.17.1-*.whl",
         "onnxruntime-gpu": "onnxruntime_gpu-1.31.1-*.whl", "torch": "torch-2.13.0*cpu*.whl"}


def wheel(cache: str, name: str) -> str | None:
    hits = sorted(glob.glob(os.path.join(cache, GLOBS[name])))
    if not hits:
        req, plat, extra = WHEELS[name]
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.11", "--platform", plat, "-d", cache, req, *extra],
                       capture_output=True, text=True, check=False)  # a failure shows as SKIP
        hits = sorted(glob.glob(os.path.join(cache, GLOBS[name])))
    return hits[0] if hits else None


def extract(whl: str, dest: str, members: list[str]) -> dict[str, str]:
    """Members (by a path suffix or a folder prefix ending in '/') extracted under dest."""
    out = {}
    with zipfile.ZipFile(whl) as zf:
        for info in zf.infolist():
            if any(info.filename.endswith(m) or (m.endswith("/") and info.filename.startswith(m)) for m in members):
                out[info.filename] = zf.extract(info, dest)
    return out


def findings(report, suffix: str):
    (res,) = [f for f in report.files if f.path.endswith(suffix)]
    return res, res.findings


RESULTS: list[tuple[str, str, str]] = []


def record(check: str, ok: bool, seen: str) -> None:
    RESULTS.append(("PASS" if ok else "FAIL", check, seen))


def numpy_check(whl, tmp, policy):
    files = extract(whl, tmp, ["_umath_linalg.cpython-311-x86_64-linux-gnu.so"])
    alone = os.path.join(tmp, "alone")
    os.makedirs(alone)
    so = os.path.join(alone, "_umath_linalg.so")
    os.rename(next(iter(files.values())), so)
    res, fs = findings(check_paths([so], policy), "_umath_linalg.so")
    needed = [f.subject for f in fs if f.kind == "needed" and f.rule == "blas.openblas"]
    imports = [f for f in fs if f.kind == "imported-symbol" and f.rule == "blas.reference"]
    record("numpy _umath_linalg alone fails by the renamed NEEDED name", res.verdict == "fail" and bool(needed),
           f"verdict {res.verdict}; needed {needed}")
    record("numpy's scipy_*_64_ imports are the BLAS API", bool(imports) and imports[0].subject.startswith("scipy_"),
           f"{imports[0].subject} +{imports[0].count - 1}" if imports else "none")


def scipy_check(whl, tmp, policy):
    extract(whl, tmp, ["scipy/linalg/cython_blas.cpython-311-x86_64-linux-gnu.so", "scipy.libs/"])
    _, fs = findings(check_paths([os.path.join(tmp, "scipy/linalg")], policy), "cython_blas.cpython-311-x86_64-linux-gnu.so")
    imports = [f for f in fs if f.kind == "imported-symbol" and f.rule == "blas.reference"]
    needed = [f.subject for f in fs if f.kind == "needed" and f.rule == "blas.openblas"]
    record("scipy cython_blas: scipy_ imports and libscipy_openblas-<hash>.so", bool(imports and needed),
           f"{imports[0].subject if imports else None}; needed {needed}")


def onnxruntime_check(whl, tmp, policy):
    extract(whl, tmp, ["onnxruntime/capi/"])
    capi = os.path.join(tmp, "onnxruntime/capi")
    mods = sorted(glob.glob(os.path.join(capi, "onnxruntime_pybind11_state*.so")) + glob.glob(os.path.join(capi, "libonnxruntime.so.*")))
    report = check_paths(mods + [os.path.join(capi, "libonnxruntime_providers_cuda.so")], policy)
    for m in mods:
        _, fs = findings(report, os.path.basename(m))
        chains = [f.chain for f in fs if f.kind == "transitive" and f.rule == "nvidia.cublas"]
        ok = any("libonnxruntime_providers_cuda.so (dlopen)" in c for c in chains)
        record(f"{os.path.basename(m)} -> providers_cuda (dlopen) -> cuBLAS", ok, " -> ".join(chains[0]) if chains else "none")
    _, fs = findings(report, "libonnxruntime_providers_cuda.so")
    by = {(f.rule, f.kind): f for f in fs}
    api, built = by.get(("nvidia.cudnn", "dlsym-string")), by.get(("nvidia.cudnn", "assembled-name"))
    record("providers_cuda: cuDNN by its dlsym names and the name built from immediates", bool(api and built),
           f"dlsym {api.count if api else 0} names; assembled {built.subject if built else None}")
    fa, me = by.get(("attention.flash-attn", "device-kernel")), by.get(("attention.xformers", "device-kernel"))
    record("providers_cuda: onnxruntime::flash and AttentionKernel kernels", bool(fa and me),
           f"flash-attn {fa.subject[:48] if fa else None}...; mem-efficient {me.subject[:48] if me else None}...")


def torch_check(whl, tmp, policy):
    extract(whl, tmp, ["torch/bin/test_shim", "torch/lib/libtorch.so", "torch/lib/libtorch_cpu.so",
                       "torch/lib/libc10.so", "torch/lib/libgomp.so.1"])
    res, fs = findings(check_paths([os.path.join(tmp, "torch")], policy), "bin/test_shim")
    node = next((c for c in res.tree.children if c.name == "libtorch_cpu.so"), None)
    unresolved = [f.subject for f in fs if f.kind == "unresolved" and f.subject == "libtorch_cpu.so"]
    record("torch bin/test_shim: libtorch_cpu.so resolved among the members",
           node is not None and node.how == "member" and not unresolved,
           f"how {node.how if node else None}; {[w for w in res.warnings if 'libtorch_cpu' in w][:1]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default="/work/cache/wheels")
    args = ap.parse_args()
    os.makedirs(args.cache, exist_ok=True)
    policy = load_policy(None)
    for name, fn in (("numpy", numpy_check), ("scipy", scipy_check), ("onnxruntime-gpu", onnxruntime_check),
                     ("torch", torch_check)):
        whl = wheel(args.cache, name)
        if whl is None:
            RESULTS.append(("SKIP", name, "wheel not available"))
            continue
        with tempfile.TemporaryDirectory(prefix="discovery-") as tmp:
            fn(whl, tmp, policy)
    for state, check, seen in RESULTS:
        print(f"{state}  {check}: {seen}")
    return 1 if any(s == "FAIL" for s, _, _ in RESULTS) else 0


if __name__ == "__main__":
    sys.exit(main())
