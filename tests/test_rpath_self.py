"""An RPATH/RUNPATH directory is evidence of a denied library only through another file: a
vendor library whose $ORIGIN holds just itself (and links to itself) has no `rpath` finding,
while a second denied library beside it still has one. gcc-built libraries."""

from __future__ import annotations

import os

from linkage_fixtures import cc_shared

from audit.linkage.check import check_paths
from audit.linkage.policy import load_policy


def built(out, source, *flags):
    lib = cc_shared(out, source, *flags)
    (out.parent / (out.name + ".c")).unlink()  # the folder holds the libraries only
    return lib


def rpath_subjects(path) -> list[str]:
    report = check_paths([str(path)], load_policy(None))
    (fr,) = report.files
    return [f.subject for f in fr.findings if f.kind == "rpath"]


def test_a_library_beside_itself_is_not_rpath_evidence(tmp_path):
    lib = built(tmp_path / "vendor/libcublas.so.12.4", "int cublasCreate_v2(void){return 0;}\n",
                    "-Wl,-soname,libcublas.so.12", "-Wl,-rpath,$ORIGIN")
    os.symlink(lib.name, lib.parent / "libcublas.so.12")
    os.symlink("libcublas.so.12", lib.parent / "libcublas.so")
    assert rpath_subjects(lib.parent / "libcublas.so.12") == []
    assert rpath_subjects(lib) == []


def test_another_denied_library_beside_it_is(tmp_path):
    lib = built(tmp_path / "vendor/libcublas.so.12", "int cublasCreate_v2(void){return 0;}\n",
                    "-Wl,-soname,libcublas.so.12", "-Wl,-rpath,$ORIGIN")
    built(tmp_path / "vendor/libcudnn.so.9", "int cudnnCreate(void){return 0;}\n", "-Wl,-soname,libcudnn.so.9")
    assert rpath_subjects(lib) == ["libcudnn.so.9"]
