"""Seeds: real binaries built once by the real compilers into a cache folder, then read into memory.

The C sources and device sources are the test fixtures' own (tests/elf_fixtures.py,
tests/fixtures/device/), so what a seed holds is written there: NEEDED, RUNPATH, a dlopen'd vendor
name, a vendor filter library (DT_FILTER), vendor-named static symbols, HIP offload bundles (plain and CCOB-compressed), NVIDIA fatbins
(plain and LZ4). A missing compiler drops its seeds and says so in the notes.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
DEVICE_SRC = TESTS / "fixtures" / "device"
STAMP = "seeds-v7.json"

DEP_C = "int fk_dep_value(void) { return 42; }\n"
STATIC_CUBLAS_C = "int cublasSgemm_v2(void){return 0;}\nint cublasCreate_v2(void){return 0;}\n"
DLOPEN_CUDNN_C = '#include <dlfcn.h>\nvoid *load(void){return dlopen("libcudnn.so.9", RTLD_NOW);}\n'
OPENBLAS_C = "extern void cblas_dscal(int,double,double*,int);\nvoid fk_scale(double*x){cblas_dscal(4,2.0,x,1);}\n"
TINY_C = "int fk_tiny(int x) { return x + 1; }\n"


def _fixture_sources() -> dict[str, str]:
    """MAIN_C and friends from tests/elf_fixtures.py when it imports (it needs pytest)."""
    sys.path.insert(0, str(TESTS))
    try:
        import elf_fixtures as ef  # noqa: PLC0415

        return {"main": ef.MAIN_C, "prog": ef.PROG_C, "ver": ef.VER_C, "ver_map": ef.VER_MAP}
    except Exception:  # pytest missing: the same library, written here
        return {"main": '#include <dlfcn.h>\nstatic const char v[] = "libcublas.so.12";\n'
                        "extern int fk_dep_value(void);\nint cublasFakeGemm(int x){return x+fk_dep_value();}\n"
                        "void *fk_load(void){return dlopen(v, RTLD_NOW);}\n",
                "prog": "int main(void){return 0;}\n",
                "ver": "int fk_v1(void){return 1;}\nint fk_v2(void){return 2;}\n",
                "ver_map": "FK_1.0 { global: fk_v1; local: *; };\nFK_2.0 { global: fk_v2; } FK_1.0;\n"}
    finally:
        sys.path.remove(str(TESTS))


def _run(cmd, cwd, env=None) -> str | None:
    """None when it worked, else the last lines of its stderr."""
    try:
        p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if p.returncode == 0 else (p.stderr or p.stdout)[-400:]


def _ccob(bundle: bytes, version: int, method: str) -> bytes:
    """A compressed clang offload bundle (CCOB v1-v3, zlib or zstd), laid out as the
    clang-offload-bundler writes it."""
    import zlib

    if method == "zlib":
        data, code = zlib.compress(bundle), 0
    else:
        import zstandard

        data, code = zstandard.ZstdCompressor().compress(bundle), 1
    h = 0x1234_5678_9ABC_DEF0
    if version == 1:
        head = b"CCOB" + struct.pack("<HHIQ", 1, code, len(bundle), h)
    elif version == 2:
        head = b"CCOB" + struct.pack("<HHIIQ", 2, code, 24 + len(data), len(bundle), h)
    else:
        head = b"CCOB" + struct.pack("<HHQQQ", 3, code, 32 + len(data), len(bundle), h)
    return head + data


def _bundle_end(section: bytes) -> int:
    (count,) = struct.unpack_from("<Q", section, 24)
    pos, end = 32, 32
    for _ in range(count):
        off, size, idlen = struct.unpack_from("<QQQ", section, pos)
        pos += 24 + idlen
        end = max(end, pos, off + size)
    return end


def _minimal_pe() -> bytes:
    """A PE32+ DLL header (MZ stub, PE signature, COFF and optional header, no sections): a
    non-ELF binary as a Windows toolchain would leave beside the ELF files."""
    mz = bytearray(b"MZ" + b"\0" * 58 + struct.pack("<I", 64))
    coff = struct.pack("<HHIIIHH", 0x8664, 0, 0, 0, 0, 240, 0x2022)
    opt = struct.pack("<HBB", 0x20B, 14, 0) + b"\0" * 236
    return bytes(mz) + b"PE\0\0" + coff + opt + b"\0" * 64


def build(cache: Path, log=print) -> dict:
    """Build every seed into `cache` once (a stamp file lists them); returns the stamp's content:
    {"seeds": {name: relative path}, "notes": [...]}."""
    cache.mkdir(parents=True, exist_ok=True)
    stamp = cache / STAMP
    if stamp.exists():
        return json.loads(stamp.read_text())
    src = _fixture_sources()
    seeds: dict[str, str] = {}
    notes: list[str] = []
    d = cache / "elf"
    d.mkdir(exist_ok=True)
    for name, text in (("dep.c", DEP_C), ("main.c", src["main"]), ("prog.c", src["prog"]), ("ver.c", src["ver"]),
                       ("ver.map", src["ver_map"]), ("static.c", STATIC_CUBLAS_C), ("dlopen.c", DLOPEN_CUDNN_C),
                       ("blas.c", OPENBLAS_C), ("tiny.c", TINY_C)):
        (d / name).write_text(text)

    slow: list[tuple[str, list, dict | None]] = []
    hip_env = dict(os.environ, HIP_PLATFORM="amd")
    if shutil.which("hipcc"):
        slow.append(("hip_gfx1030", ["hipcc", "--offload-arch=gfx1030", "-shared", "-fPIC", "-o",
                                     d / "libfk_gfx1030.so", DEVICE_SRC / "fk_probe.hip"], hip_env))
    else:
        notes.append("hipcc not found: no HIP seeds")
    if shutil.which("nvcc"):
        for name, flags in (("sm90", ["-arch=sm_90"]),
                            ("lz4", ["-arch=sm_90", "--compress-mode=speed", "-Xfatbin=-compress-all"])):
            slow.append((f"cuda_{name}", ["nvcc", *flags, "-shared", "-Xcompiler", "-fPIC", "-o",
                                          d / f"libfk_{name}.so", DEVICE_SRC / "fk_probe.cu"], None))
    else:
        notes.append("nvcc not found: no CUDA seeds")
    procs = []
    for name, cmd, env in slow:  # the slow device builds run while gcc works
        procs.append((name, cmd, subprocess.Popen([str(c) for c in cmd], cwd=d, env=env,
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))

    gcc = [
        ("dep", "libfkdep.so", ["-shared", "-fPIC", "-o", "libfkdep.so", "dep.c", "-Wl,-soname,libfkdep.so"]),
        ("main", "libfkmain.so", ["-shared", "-fPIC", "-O1", "-o", "libfkmain.so", "main.c", "-L.", "-lfkdep", "-ldl",
                                  "-Wl,-soname,libfkmain.so.1", "-Wl,--enable-new-dtags",
                                  "-Wl,-rpath,$ORIGIN:/opt/fk/lib"]),
        ("prog", "prog", ["-o", "prog", "prog.c"]),
        ("versioned", "libfkver.so", ["-shared", "-fPIC", "-o", "libfkver.so", "ver.c", "-Wl,--version-script=ver.map",
                                      "-Wl,-soname,libfkver.so.1"]),
        ("object", "fkmain.o", ["-c", "-fPIC", "-O1", "-o", "fkmain.o", "main.c"]),
        ("static_cublas", "libstatic_cublas.so", ["-shared", "-fPIC", "-o", "libstatic_cublas.so", "static.c"]),
        ("dlopen_cudnn", "libdlopen_cudnn.so", ["-shared", "-fPIC", "-o", "libdlopen_cudnn.so", "dlopen.c", "-ldl"]),
        # cuDNN loaded as a filter library (DT_FILTER): no DT_NEEDED names it
        ("filter_cudnn", "libfilter_cudnn.so", ["-shared", "-fPIC", "-o", "libfilter_cudnn.so", "dep.c",
                                                "-Wl,--filter=libcudnn.so.9"]),
        ("openblas", "libuses_openblas.so", ["-shared", "-fPIC", "-o", "libuses_openblas.so", "blas.c",
                                             "-Wl,--no-as-needed", "-lopenblas"]),
        # SHF_COMPRESSED .debug_* sections
        ("zdebug", "libzdebug.so", ["-shared", "-fPIC", "-g", "-gz=zlib", "-o", "libzdebug.so", "main.c", "-ldl"]),
    ]
    if shutil.which("gcc"):
        for key, out, args in gcc:
            err = _run(["gcc", *args], d)
            if err is None:
                seeds[key] = f"elf/{out}"
            else:
                notes.append(f"gcc seed {key} not built: {' '.join(err.split())[:160]}")
    else:
        notes.append("gcc not found: no host seeds")
    if shutil.which("clang-15") and shutil.which("ld.lld-15"):
        for name, target in (("be64", "powerpc64-linux-gnu"), ("x86_32", "i686-linux-gnu")):
            err = _run(["clang-15", f"--target={target}", "-c", "-fPIC", "-o", f"{name}.o", "tiny.c"], d) or \
                _run(["ld.lld-15", "-shared", "-soname", f"lib{name}.so.1", "-o", f"lib{name}.so", f"{name}.o"], d)
            if err is None:
                seeds[name] = f"elf/lib{name}.so"
            else:
                notes.append(f"cross seed {name} not built: {' '.join(err.split())[:160]}")
    else:
        notes.append("clang-15/ld.lld-15 not found: no big-endian or 32-bit seeds")

    for name, cmd, p in procs:
        _out, err = p.communicate()
        if p.returncode == 0:
            seeds[name] = f"elf/{Path(str(cmd[cmd.index('-o') + 1])).name}"
        else:
            notes.append(f"{name} not built: {' '.join((err or '').split())[-160:]}")

    # CCOB-compressed offload bundles put into a gcc-built library as its .hip_fatbin
    if "hip_gfx1030" in seeds and "dep" in seeds and shutil.which("objcopy"):
        raw = d / "gfx1030.hip_fatbin"
        err = _run(["objcopy", "--dump-section", f".hip_fatbin={raw}", d / "libfk_gfx1030.so", d / "scratch.so"], d)
        if err is None:
            bundle = raw.read_bytes()
            bundle = bundle[:_bundle_end(bundle)]
            for version, method in ((1, "zlib"), (3, "zstd")):
                one = _ccob(bundle, version, method)
                (d / f"ccob{version}.bin").write_bytes(one + b"\0" * (-len(one) % 16) + one)
                out = f"libccob_v{version}_{method}.so"
                e2 = _run(["objcopy", "--add-section", f".hip_fatbin=ccob{version}.bin", "--set-section-flags",
                           ".hip_fatbin=alloc,readonly,data", "libfkdep.so", out], d)
                if e2 is None:
                    seeds[f"ccob_v{version}"] = f"elf/{out}"
                else:
                    notes.append(f"ccob v{version} not built: {e2[-160:]}")
    if shutil.which("x86_64-w64-mingw32-gcc"):
        (d / "dll.c").write_text("__declspec(dllexport) int fk_dll(void){return 1;}\n")
        err = _run(["x86_64-w64-mingw32-gcc", "-shared", "-o", "fk.dll", "dll.c"], d)
        if err is None:
            seeds["pe"] = "elf/fk.dll"
        (d / "obj.c").write_text("int cublasCreate_v2(void **);\nint fk_obj(void){void *h; return cublasCreate_v2(&h);}\n")
        if _run(["x86_64-w64-mingw32-gcc", "-c", "-o", "fk.obj", "obj.c"], d) is None:
            seeds["coff"] = "elf/fk.obj"
    if shutil.which("mcs"):  # a managed assembly whose P/Invoke loads cuBLAS (CLI metadata)
        (d / "managed.cs").write_text('using System; using System.Runtime.InteropServices;\n'
                                      'public static class N { [DllImport("cublas64_12.dll")]\n'
                                      'public static extern int cublasCreate_v2(out IntPtr h); }\n')
        err = _run(["mcs", "-target:library", "-out:managed.dll", "managed.cs"], d)
        if err is None:
            seeds["clr"] = "elf/managed.dll"
        else:
            notes.append(f"mcs seed not built: {' '.join(err.split())[:160]}")
    else:
        notes.append("mcs not found: no managed-assembly seed")
    if shutil.which("dpkg-deb") and "dlopen_cudnn" in seeds:  # a Debian package holding a library
        pkg = d / "debpkg"
        (pkg / "DEBIAN").mkdir(parents=True, exist_ok=True)
        (pkg / "DEBIAN" / "control").write_text("Package: fk\nVersion: 1.0\nArchitecture: amd64\n"
                                                "Maintainer: fk <fk@example.org>\nDescription: fuzz seed\n")
        (pkg / "usr" / "lib").mkdir(parents=True, exist_ok=True)
        shutil.copy(cache / seeds["dlopen_cudnn"], pkg / "usr" / "lib" / "libfkdeb.so")
        err = _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", "debpkg", "fk.deb"], d)
        if err is None:
            seeds["deb"] = "elf/fk.deb"
        else:
            notes.append(f"dpkg-deb seed not built: {' '.join(err.split())[:160]}")
    if shutil.which("rpmbuild") and "dlopen_cudnn" in seeds:  # an RPM package holding a library
        top = d / "rpmbuild"
        spec = d / "fk.spec"
        spec.write_text(f"Name: fk\nVersion: 1.0\nRelease: 1\nSummary: fk\nLicense: MIT\nBuildArch: x86_64\n"
                        f"%description\nfk\n%install\nmkdir -p %{{buildroot}}/usr/lib\n"
                        f"cp {cache / seeds['dlopen_cudnn']} %{{buildroot}}/usr/lib/libfkrpm.so\n"
                        f"%files\n/usr/lib/libfkrpm.so\n")
        err = _run(["rpmbuild", "-bb", "--quiet", "--define", f"_topdir {top}", "--define", "debug_package %{nil}",
                    "--define", "__strip /bin/true", str(spec)], d)
        built = sorted(top.glob("RPMS/*/*.rpm"))
        if err is None and built:
            shutil.copy(built[0], d / "fk.rpm")
            seeds["rpm"] = "elf/fk.rpm"
        else:
            notes.append(f"rpmbuild seed not built: {' '.join((err or 'no package').split())[:160]}")
    if shutil.which("bsdtar") and "dlopen_cudnn" in seeds:  # a newc cpio archive (an initramfs's format)
        root = d / "cpioroot" / "usr" / "lib"
        root.mkdir(parents=True, exist_ok=True)
        shutil.copy(cache / seeds["dlopen_cudnn"], root / "libfkcpio.so")
        err = _run(["bsdtar", "--format", "newc", "-cf", str(d / "fk.cpio"), "-C", str(d / "cpioroot"), "usr"], d)
        if err is None:
            seeds["cpio"] = "elf/fk.cpio"
        else:
            notes.append(f"bsdtar cpio seed not built: {' '.join(err.split())[:160]}")
    if "pe" not in seeds:
        (d / "fk.dll").write_bytes(_minimal_pe())
        seeds["pe"] = "elf/fk.dll"
        notes.append("x86_64-w64-mingw32-gcc not found: the PE seed is a written header")

    # a baseline: this tool's own JSON result of a folder with findings (mutated for --baseline)
    if "static_cublas" in seeds and "dlopen_cudnn" in seeds:
        bdir = cache / "baseline-input"
        bdir.mkdir(exist_ok=True)
        for k in ("static_cublas", "dlopen_cudnn"):
            shutil.copy(cache / seeds[k], bdir)
        subprocess.run([sys.executable, "-m", "audit", "check", str(bdir), "--format", f"json={cache / 'baseline.json'}"],
                       cwd=REPO, capture_output=True, timeout=300)
        if (cache / "baseline.json").exists():
            seeds["baseline"] = "baseline.json"
    stamp.write_text(json.dumps({"seeds": seeds, "notes": notes}, indent=1))
    for n in notes:
        log(f"note: {n}")
    return {"seeds": seeds, "notes": notes}


def load(cache: Path, log=print) -> tuple[dict[str, bytes], list[str]]:
    built = build(cache, log)
    return {k: (cache / v).read_bytes() for k, v in built["seeds"].items()}, built["notes"]
