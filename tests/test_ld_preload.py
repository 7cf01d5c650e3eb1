"""/etc/ld.so.preload of the audited system (a container image's, or --root's) and LD_PRELOAD (an
image's Env, or this shell's under --use-env): glibc's ld.so loads every library they name into
every dynamically linked program, before the program's own dependencies. A vendor library there
is in every process of the image, though no file names it. This machine's own /etc/ld.so.preload
is never read: it is the runner's, not the artifact's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import require_tool
from image_fixtures import docker_archive, layer_tar
from linkage_fixtures import cc_shared, run

from audit.errors import EXIT_OK, EXIT_VIOLATION
from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import ResolveOptions
from cli_runner import cli


def libs(tmp_path) -> dict[str, bytes]:
    require_tool("gcc")
    cudnn = cc_shared(tmp_path / "libcudnn.so.9", "int cudnnCreate(void){return 0;}\n", "-Wl,-soname,libcudnn.so.9")
    app = cc_shared(tmp_path / "libapp.so", "int app(void){return 1;}\n", "-Wl,-soname,libapp.so")
    return {"cudnn": cudnn.read_bytes(), "app": app.read_bytes()}


def image(tmp_path, preload: bytes | None, cudnn: bool = True) -> Path:
    b = libs(tmp_path)
    entries = [("file", "opt/app/libapp.so", b["app"])]
    if cudnn:
        entries.append(("file", "opt/nv/libcudnn.so.9", b["cudnn"]))
    if preload is not None:
        entries.append(("file", "etc/ld.so.preload", preload))
    return docker_archive(tmp_path / "img.tar", [layer_tar(entries)])


def test_an_image_preloading_cudnn_fails_every_program_it_would_run(tmp_path, capsys):
    """Before: PASS (libapp.so needs nothing but libc)."""
    img = image(tmp_path, b"# preloaded into every process\n/opt/nv/libcudnn.so.9\n")
    rc, out, err = cli(capsys, "check", str(img))
    assert rc == EXIT_VIOLATION, out + err
    assert "needed: /opt/nv/libcudnn.so.9  (/etc/ld.so.preload)" in out
    assert f"{img}!/opt/app/libapp.so" in out


def test_an_image_without_a_preload_or_with_a_clean_one_passes(tmp_path, capsys):
    for preload in (None, b"/opt/app/libapp.so\n"):
        rc, out, err = cli(capsys, "check", str(image(tmp_path, preload, cudnn=False)))
        assert rc == EXIT_OK, out + err


def test_a_sysroot_s_preload_counts_and_a_symlink_out_of_it_is_not_followed(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "lib").mkdir()
    b = libs(tmp_path)
    (root / "lib/libapp.so").write_bytes(b["app"])
    (root / "lib/libcudnn.so.9").write_bytes(b["cudnn"])
    (root / "etc/ld.so.preload").write_text("libcudnn.so.9: /lib/libcudnn.so.9\n")
    opts = ResolveOptions.from_cli(root=str(root))
    res = check_paths([str(root / "lib/libapp.so")], load_policy(None), opts).files[0]
    assert ("nvidia.cudnn", "needed", "/etc/ld.so.preload") in {(f.rule, f.kind, f.where) for f in res.failing}
    # an absolute symlink is resolved inside the sysroot: a host file it names is never read
    outside = tmp_path / "host_secret"
    outside.write_text("libcudnn.so.9\n")
    (root / "etc/ld.so.preload").unlink()
    (root / "etc/ld.so.preload").symlink_to(outside)
    res = check_paths([str(root / "lib/libapp.so")], load_policy(None), opts).files[0]
    assert not [f for f in res.findings if f.where == "/etc/ld.so.preload"]


def test_this_machine_s_preload_is_not_the_artifact_s():
    """Without an image or --root nothing is read from /etc/ld.so.preload (the runner's file)."""
    from audit.linkage.resolution.ldso import Resolver

    r = Resolver(ResolveOptions(), load_policy(None), read=lambda p: None)
    assert r.preload == []


def test_glibc_preloads_what_the_file_names(tmp_path):
    """The mechanism, through LD_PRELOAD (the same list as the file, which needs root to write):
    the preloaded library's constructor runs in a program that names it nowhere."""
    require_tool("gcc")
    lib = cc_shared(tmp_path / "libpre.so", '#include <unistd.h>\n__attribute__((constructor)) static void c(void)'
                    ' { write(1, "preloaded\\n", 10); }\n')
    main = tmp_path / "main.c"
    main.write_text("int main(void) { return 3; }\n")
    exe = tmp_path / "prog"
    run("gcc", "-o", exe, main)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "LD_PRELOAD": str(lib)})
    assert (proc.returncode, proc.stdout) == (3, "preloaded\n")


def test_a_preload_list_past_the_bound_is_an_error_not_a_pass(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "lib/libapp.so").write_bytes(libs(tmp_path)["app"])
    (root / "etc/ld.so.preload").write_text("\n".join(f"/lib/libx{i}.so" for i in range(1025)))
    res = check_paths([str(root / "lib/libapp.so")], load_policy(None), ResolveOptions.from_cli(root=str(root))).files[0]
    assert res.verdict == "error" and "ld.so.preload names more than 1024" in (res.error or "")


def test_an_image_whose_env_preloads_cudnn_fails(tmp_path, capsys):
    """LD_PRELOAD in the image config's Env: every process of the image loads it."""
    b = libs(tmp_path)
    layer = layer_tar([("file", "opt/app/libapp.so", b["app"]), ("file", "opt/nv/libcudnn.so.9", b["cudnn"])])
    img = docker_archive(tmp_path / "env.tar", [layer], env=["LD_PRELOAD=/opt/nv/libcudnn.so.9", "PATH=/usr/bin"])
    rc, out, err = cli(capsys, "check", str(img))
    assert rc == EXIT_VIOLATION and "needed: /opt/nv/libcudnn.so.9  (LD_PRELOAD)" in out, out + err


def test_use_env_takes_this_shell_s_ld_preload_as_it_takes_ld_library_path(tmp_path, monkeypatch):
    libs(tmp_path)
    app = tmp_path / "libapp.so"
    monkeypatch.setenv("LD_PRELOAD", f"{tmp_path / 'libcudnn.so.9'}")
    res = check_paths([str(app)], load_policy(None), ResolveOptions.from_cli(use_env=True)).files[0]
    assert ("nvidia.cudnn", "needed", "LD_PRELOAD") in {(f.rule, f.kind, f.where) for f in res.failing}
    plain = check_paths([str(app)], load_policy(None), ResolveOptions.from_cli()).files[0]
    assert plain.verdict == "pass"  # without --use-env the shell is not the artifact


def test_a_sysroot_s_ld_so_conf_symlinked_out_of_it_is_not_followed(tmp_path):
    """ld.so.conf is read as the preload list is: a link out of the sysroot resolves inside it,
    so a host file never becomes the audited system's search directories."""
    from audit.linkage.resolution.ldso import Paths, read_ldso_conf

    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    host = tmp_path / "host.conf"
    host.write_text("/host/only/dir\n")
    (root / "etc/ld.so.conf").symlink_to(host)
    dirs, warnings = read_ldso_conf(Paths(str(root)), "/etc/ld.so.conf")
    assert "/host/only/dir" not in dirs
    (root / "etc/ld.so.conf").unlink()
    (root / "etc/ld.so.conf").write_text("/opt/lib\n")
    assert read_ldso_conf(Paths(str(root)), "/etc/ld.so.conf")[0][:1] == ["/opt/lib"]
