"""Linkage fixtures: small shared objects built by gcc at test time (session-scoped).

Each builder compiles real C with the system's gcc/ld (and patchelf where the point is an
edited binary), into `fixture_root/linkage`. Nothing here is produced by the code under test.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from conftest import require_tool

OPENBLAS = "libopenblas.so.0"


def tarball(members: dict[str, bytes], mode: str = "w:gz") -> bytes:
    """A tar (gzip by default) of regular files, written by tarfile."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in members.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def run(*cmd, cwd=None):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{proc.stderr}")
    return proc.stdout


def cc_shared(out: Path, source: str, *flags, name: str | None = None) -> Path:
    """gcc -shared -fPIC of `source` (C text) into `out`; `flags` go last (libs, -Wl,...)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(out.suffix + ".c") if name is None else out.parent / name
    src.write_text(source)
    run("gcc", "-shared", "-fPIC", "-O1", "-o", out, src, "-Wl,--no-as-needed", *flags)
    return out


def openblas_available() -> bool:
    return any(Path(d, OPENBLAS).exists() for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib"))


def retag_dynamic(path: Path, old_tag: int, new_tag: int) -> None:
    """Change one .dynamic entry's d_tag in place (64-bit little-endian), as a binary editor would.

    Used to give one object both DT_RPATH and DT_RUNPATH (GNU ld never emits both): the object
    is linked with a DT_SONAME string that then becomes its DT_RUNPATH.
    """
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        dyn = elf.get_section_by_name(".dynamic")
        offset, size = dyn["sh_offset"], dyn["sh_size"]
    data = bytearray(path.read_bytes())
    for pos in range(offset, offset + size, 16):
        tag = struct.unpack_from("<q", data, pos)[0]
        if tag == old_tag:
            struct.pack_into("<q", data, pos, new_tag)
            path.write_bytes(bytes(data))
            return
        if tag == 0:
            break
    raise RuntimeError(f"{path}: no dynamic tag {old_tag}")


DT_SONAME, DT_RUNPATH = 14, 29


class Lib:
    """Paths of the built fixtures, by name."""

    def __init__(self, root: Path):
        self.root = root
        self.paths: dict[str, Path] = {}

    def __getitem__(self, key: str) -> Path:
        return self.paths[key]


def build_linkage_fixtures(base: Path) -> Lib:
    require_tool("gcc")
    root = base / "linkage"
    if root.exists():
        shutil.rmtree(root)
    libs = Lib(root)
    p = libs.paths

    # a clean library: libm and libc only
    p["clean"] = cc_shared(root / "clean/libclean.so",
                           "#include <math.h>\ndouble fk_norm(double x){return sqrt(x*x+1.0);}\n", "-lm")

    # anchoring: names that merely contain vendor words, or miss the next-character rule
    p["lookalike"] = cc_shared(root / "lookalike/liblookalike.so",
                               "int my_cublas_helper(void){return 1;}\nint cublasfoo(void){return 2;}\n"
                               "int xsgemm_(void){return 3;}\nint fk_cudnn_like(void){return 4;}\n")

    # a vendor-named static symbol (a statically linked cuBLAS would define these)
    p["static_cublas"] = cc_shared(root / "static/libstatic_cublas.so",
                                   "int cublasSgemm_v2(void){return 0;}\nint cublasCreate_v2(void){return 0;}\n")

    # dlopen of a vendor library by name, and of the base runtime by name (allowed)
    p["dlopen_cudnn"] = cc_shared(root / "dlopen/libdlopen_cudnn.so",
                                  '#include <dlfcn.h>\nvoid *load(void){return dlopen("libcudnn.so.9", RTLD_NOW);}\n',
                                  "-ldl")
    p["dlopen_cuda"] = cc_shared(root / "dlopen_ok/libdlopen_cuda.so",
                                 '#include <dlfcn.h>\nvoid *load(void){return dlopen("libcuda.so.1", RTLD_NOW);}\n',
                                 "-ldl")

    if openblas_available():
        blas_src = "extern void cblas_dscal(int,double,double*,int);\nvoid fk_scale(double*x){cblas_dscal(4,2.0,x,1);}\n"
        p["openblas"] = cc_shared(root / "openblas/libuses_openblas.so", blas_src, "-lopenblas")
        # reached through a $ORIGIN RUNPATH'd intermediate
        mid = cc_shared(root / "origin/deps/libmiddle.so", blas_src, "-lopenblas")
        p["origin_mid"] = mid
        p["origin_top"] = cc_shared(root / "origin/libtop.so", "int fk_top(void){return 0;}\n",
                                    f"-L{mid.parent}", "-lmiddle", "-Wl,-rpath,$ORIGIN/deps", "-Wl,--enable-new-dtags")

    # NEEDED removed, verneed kept: a versioned fake libcublas.so.12, linked, then patchelf'd away
    vend = root / "verneed/vendor"
    vend.mkdir(parents=True, exist_ok=True)
    (vend / "cublas.map").write_text("libcublas.so.12 { global: cublasCreate_v2; local: *; };\n")
    cc_shared(vend / "libcublas.so.12", "int cublasCreate_v2(void){return 0;}\n",
              f"-Wl,--version-script={vend / 'cublas.map'}", "-Wl,-soname,libcublas.so.12")
    user = cc_shared(root / "verneed/libhidden.so",
                     "extern int cublasCreate_v2(void);\nint fk_init(void){return cublasCreate_v2();}\n",
                     f"-L{vend}", "-l:libcublas.so.12")
    if shutil.which("patchelf"):
        run("patchelf", "--remove-needed", "libcublas.so.12", user)
        p["verneed"] = user

    # RPATH vs RUNPATH. rp/: a leaf library exists in two directories, A and B.
    rp = root / "rpath"
    for d in ("A", "B"):
        cc_shared(rp / d / "libleaf.so", f"int leaf_{d}(void){{return 0;}}\n")
    cc_shared(rp / "A/libmid.so", "int mid(void){return 0;}\n", f"-L{rp / 'A'}", "-lleaf")
    # DT_RPATH only (A): inherited by libmid's own lookup of libleaf
    p["rpath_only"] = cc_shared(rp / "rpath_only/libroot.so", "int r(void){return 0;}\n",
                                f"-L{rp / 'A'}", "-lmid", "-Wl,--disable-new-dtags", f"-Wl,-rpath,{rp / 'A'}")
    # DT_RUNPATH only (A): applies to libroot's direct needs, not to libmid's
    p["runpath_only"] = cc_shared(rp / "runpath_only/libroot.so", "int r(void){return 0;}\n",
                                  f"-L{rp / 'A'}", "-lmid", "-Wl,--enable-new-dtags", f"-Wl,-rpath,{rp / 'A'}")
    # both: DT_RPATH=B, DT_RUNPATH=A (from a retagged DT_SONAME): RPATH must be ignored
    both = cc_shared(rp / "both/libroot.so", "int r(void){return 0;}\n", f"-L{rp / 'A'}", "-lleaf",
                     "-Wl,--disable-new-dtags", f"-Wl,-rpath,{rp / 'B'}", f"-Wl,-soname,{rp / 'A'}")
    retag_dynamic(both, DT_SONAME, DT_RUNPATH)
    p["both"] = both

    # a cycle: liba <-> libb, both RUNPATH $ORIGIN
    cyc = root / "cycle"
    cc_shared(cyc / "liba.so", "int a(void){return 0;}\n")
    cc_shared(cyc / "libb.so", "int b(void){return 0;}\n", f"-L{cyc}", "-la", "-Wl,-rpath,$ORIGIN",
              "-Wl,--enable-new-dtags")
    p["cycle"] = cc_shared(cyc / "liba.so", "int a(void){return 0;}\n", f"-L{cyc}", "-lb",
                           "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags")

    # class mismatch: a 32-bit libwide.so first in RUNPATH, the 64-bit one second
    cls = root / "class"
    (cls / "m32").mkdir(parents=True, exist_ok=True)
    (cls / "m32/x.c").write_text("int wide(void){return 32;}\n")
    run("gcc", "-m32", "-shared", "-fPIC", "-nostdlib", "-o", cls / "m32/libwide.so", cls / "m32/x.c")
    cc_shared(cls / "m64/libwide.so", "int wide(void){return 64;}\n")
    p["class"] = cc_shared(cls / "libuser.so", "int u(void){return 0;}\n", f"-L{cls / 'm64'}", "-lwide",
                           f"-Wl,-rpath,{cls / 'm32'}:{cls / 'm64'}", "-Wl,--enable-new-dtags")

    # a sysroot: ld.so.conf with an include, an absolute symlink that must stay inside the root
    sysroot = root / "sysroot"
    vlib = sysroot / "opt/vendor/lib"
    cc_shared(vlib / "libfoo.so.1", "int foo(void){return 0;}\n", "-Wl,-soname,libfoo.so.1")
    cc_shared(vlib / "libbar.so.1.0", "int bar(void){return 0;}\n", "-Wl,-soname,libbar.so.1")
    (sysroot / "usr/lib").mkdir(parents=True, exist_ok=True)
    os.symlink("/opt/vendor/lib/libbar.so.1.0", sysroot / "usr/lib/libbar.so.1")
    (sysroot / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (sysroot / "etc/ld.so.conf").write_text("# sysroot\ninclude /etc/ld.so.conf.d/*.conf\n")
    (sysroot / "etc/ld.so.conf.d/vendor.conf").write_text("/opt/vendor/lib\n")
    libc = next(Path(d, "libc.so.6") for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64")
                if Path(d, "libc.so.6").exists())
    (sysroot / "lib/x86_64-linux-gnu").mkdir(parents=True, exist_ok=True)
    shutil.copy(libc, sysroot / "lib/x86_64-linux-gnu/libc.so.6")
    app = sysroot / "usr/bin/libapp.so"
    cc_shared(app, "int app(void){return 0;}\n", f"-L{vlib}", "-l:libfoo.so.1", "-l:libbar.so.1.0")
    p["sysroot_app"] = app
    p["sysroot"] = sysroot
    return libs


@pytest.fixture(scope="session")
def linkage_libs(fixture_root) -> Lib:
    return build_linkage_fixtures(Path(fixture_root))


DEVICE_SRC = Path(__file__).parent / "fixtures" / "linkage"


def _compile_parallel(jobs: dict[str, list[str]], env=None) -> None:
    procs = {k: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for k, cmd in jobs.items()}
    errors = []
    for k, proc in procs.items():
        _, err = proc.communicate()
        if proc.returncode != 0:
            errors.append(f"{k}: {' '.join(jobs[k])}\n{err}")
    if errors:
        raise RuntimeError("\n".join(errors))


@pytest.fixture(scope="session")
def hip_linkage_libs(fixture_root) -> dict[str, Path]:
    """hipcc --offload-arch=gfx1030: our own kernel, and one named like a Tensile GEMM kernel."""
    hipcc = require_tool("hipcc")
    d = Path(fixture_root) / "linkage-hip"
    d.mkdir(exist_ok=True)
    env = dict(os.environ, HIP_PLATFORM="amd")  # hipcc picks NVIDIA when nvcc is on PATH
    jobs = {name: [hipcc, "--offload-arch=gfx1030", "-shared", "-fPIC", "-o", str(d / f"lib{name}.so"),
                   str(DEVICE_SRC / f"{name}.hip")] for name in ("sovereign_kernel", "tensile_named")}
    _compile_parallel(jobs, env)
    return {name: d / f"lib{name}.so" for name in jobs}


@pytest.fixture(scope="session")
def cuda_linkage_libs(fixture_root) -> dict[str, Path]:
    """nvcc -arch=sm_90 (cudart static, nvcc's default): our own kernel, one in namespace cutlass, attention
    kernels named like the vendor families, and our own attention kernels' names."""
    nvcc = require_tool("nvcc")
    d = Path(fixture_root) / "linkage-cuda"
    d.mkdir(exist_ok=True)
    jobs = {name: [nvcc, "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-o", str(d / f"lib{name}.so"),
                   str(DEVICE_SRC / f"{name}.cu")]
            for name in ("sovereign_kernel", "cutlass_named", "attention_named", "attention_own")}
    _compile_parallel(jobs)
    return {name: d / f"lib{name}.so" for name in jobs}
