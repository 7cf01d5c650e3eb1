"""An RPATH/RUNPATH directory is not a linkage of what else lies in it. A library the object
needs or names is reported by that mechanism wherever it resolves; one it neither needs nor
names is no evidence (numpy's bundled libgfortran: RPATH $ORIGIN, OpenBLAS beside it); it is
only a note (severity warn, exit 0) when the object imports dlopen. The object itself beside
itself is never counted. gcc-built libraries, laid out as a wheel's .libs folder."""

from __future__ import annotations

import os

from linkage_fixtures import cc_shared

from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy


def built(out, source, *flags):
    lib = cc_shared(out, source, *flags)
    (out.parent / (out.name + ".c")).unlink()  # the folder holds the libraries only
    return lib


def audit(path):
    report = check_paths([str(path)], load_policy(None))
    (fr,) = report.files
    return report, fr


def rpath(fr):
    return [(f.subject, f.severity) for f in fr.findings if f.kind == "rpath"]


def test_a_library_beside_itself_is_not_rpath_evidence(tmp_path):
    lib = built(tmp_path / "vendor/libcublas.so.12.4", "int cublasCreate_v2(void){return 0;}\n",
                "-Wl,-soname,libcublas.so.12", "-Wl,-rpath,$ORIGIN")
    os.symlink(lib.name, lib.parent / "libcublas.so.12")
    os.symlink("libcublas.so.12", lib.parent / "libcublas.so")
    assert rpath(audit(lib.parent / "libcublas.so.12")[1]) == []
    assert rpath(audit(lib)[1]) == []


def test_a_denied_library_beside_one_that_does_not_load_it_is_no_evidence(tmp_path):
    # numpy.libs: libgfortran (RPATH $ORIGIN) beside the OpenBLAS that needs it, not the reverse
    libs = tmp_path / "pkg.libs"
    gfortran = built(libs / "libgfortran-040039e1.so.5", "int _gfortran_st_write(void){return 0;}\n",
                     "-Wl,-soname,libgfortran-040039e1.so.5", "-Wl,-rpath,$ORIGIN", "-Wl,--disable-new-dtags")
    built(libs / "libscipy_openblas64_-32a4b2a6.so", "int openblas_get_config64_(void){return 0;}\n",
          "-Wl,-soname,libscipy_openblas64_-32a4b2a6.so", f"-L{libs}", "-l:libgfortran-040039e1.so.5",
          "-Wl,-rpath,$ORIGIN", "-Wl,--disable-new-dtags")
    report, fr = audit(gfortran)
    assert fr.rpath == ["$ORIGIN"] and fr.findings == [] and fr.verdict == "pass" and report.exit_code == 0
    # the same holds for it walked in OpenBLAS's tree: OpenBLAS is only itself there
    _, blas = audit(libs / "libscipy_openblas64_-32a4b2a6.so")
    assert rpath(blas) == [] and {f.kind for f in blas.findings} == {"soname", "static-symbol"}


def test_a_needed_library_found_through_runpath_is_a_needed_finding_only(tmp_path):
    libs = tmp_path / "pkg.libs"
    built(libs / "libcudnn.so.9", "int cudnnCreate(void){return 0;}\n", "-Wl,-soname,libcudnn.so.9")
    ext = cc_shared(tmp_path / "pkg/ext.so", "int ext(void){return 0;}\n", f"-L{libs}", "-l:libcudnn.so.9",
                    "-Wl,-rpath,$ORIGIN/../pkg.libs", "-Wl,--enable-new-dtags")
    _, fr = audit(ext)
    needed = [f for f in fr.findings if f.kind == "needed"]
    assert [(f.rule, f.subject) for f in needed] == [("nvidia.cudnn", "libcudnn.so.9")]
    assert needed[0].detail.endswith("pkg.libs/libcudnn.so.9 (DT_RUNPATH of ext.so)")
    assert rpath(fr) == [] and fr.verdict == "fail"


def test_a_dlopen_caller_gets_a_note_not_a_failure(tmp_path):
    libs = tmp_path / "pkg.libs"
    built(libs / "libcudnn.so.9", "int cudnnCreate(void){return 0;}\n", "-Wl,-soname,libcudnn.so.9")
    # the name is read at run time (an argument), so no string in the object names it
    loader = built(tmp_path / "pkg/libloader.so",
                   "#include <dlfcn.h>\nvoid *load(const char *n){return dlopen(n, RTLD_NOW);}\n",
                   "-ldl", "-Wl,-rpath,$ORIGIN/../pkg.libs", "-Wl,--enable-new-dtags")
    report, fr = audit(loader)
    (note,) = [f for f in fr.findings if f.kind == "rpath"]
    assert (note.rule, note.subject, note.where, note.severity) == (
        "nvidia.cudnn", "libcudnn.so.9", "DT_RUNPATH $ORIGIN/../pkg.libs", "warn")
    assert "imports dlopen" in note.detail
    assert fr.verdict == "pass" and report.exit_code == 0
