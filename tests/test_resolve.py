"""ld.so-style resolution on gcc-built objects: RPATH vs RUNPATH, $ORIGIN, order, class, cycles,
ld.so.conf includes, sysroots, --ldpath and --use-env."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import require_tool
from linkage_fixtures import cc_shared, linkage_libs  # noqa: F401  (fixture)

from audit.linkage.check import check_paths
from audit.linkage.judging.policy import load_policy
from audit.linkage.resolution.ldso import Paths, ResolveOptions, expand_dst, read_ldso_conf


@functools.lru_cache(maxsize=1)
def policy():
    return load_policy(None)


def audit(path, pol=None, **opts):
    report = check_paths([str(path)], pol or policy(), ResolveOptions(**opts))
    assert len(report.files) == 1, report.files
    return report.files[0]


def child(node, name):
    hits = [c for c in node.children if c.name == name]
    assert hits, f"{name} not among {[c.name for c in node.children]}"
    return hits[0]


def test_rpath_is_inherited_by_the_loaded_library(linkage_libs):
    res = audit(linkage_libs["rpath_only"])
    mid = child(res.tree, "libmid.so")
    leaf = child(mid, "libleaf.so")
    a = linkage_libs.root / "rpath/A"
    assert (mid.how, mid.via) == ("rpath", "libroot.so")
    # libmid has no RPATH of its own: the loader's (libroot's) DT_RPATH finds libleaf
    assert (leaf.how, leaf.via, Path(leaf.path).parent) == ("rpath", "libroot.so", a)
    assert res.verdict == "pass"


def test_runpath_applies_to_direct_dependencies_only(linkage_libs):
    res = audit(linkage_libs["runpath_only"])
    mid = child(res.tree, "libmid.so")
    assert (mid.how, mid.via) == ("runpath", "libroot.so")
    assert child(mid, "libleaf.so").status == "unresolved"
    unresolved = [f for f in res.findings if f.kind == "unresolved"]
    assert [f.chain for f in unresolved] == [["libroot.so", "libmid.so", "libleaf.so"]]
    assert unresolved[0].severity == "warn" and res.verdict == "pass"  # default: warn


def test_unresolved_can_be_made_fatal(linkage_libs, tmp_path):
    strict = tmp_path / "strict.toml"
    strict.write_text('extends = "sovereign"\n[settings]\nunresolved = "fail"\n')
    res = audit(linkage_libs["runpath_only"], load_policy(strict))
    assert res.verdict == "fail" and [f.rule for f in res.failing] == ["linkage.unresolved"]


def test_rpath_is_ignored_when_runpath_exists(linkage_libs):
    both = linkage_libs["both"]
    res = audit(both)
    assert res.rpath == [str(linkage_libs.root / "rpath/B")]
    assert res.runpath == [str(linkage_libs.root / "rpath/A")]
    leaf = child(res.tree, "libleaf.so")
    assert leaf.how == "runpath" and Path(leaf.path).parent == linkage_libs.root / "rpath/A"


def test_ldpath_and_ld_library_path_come_before_runpath(linkage_libs, monkeypatch):
    b = str(linkage_libs.root / "rpath/B")
    leaf = child(audit(linkage_libs["both"], ldpath=[b]).tree, "libleaf.so")
    assert leaf.how == "ldpath" and Path(leaf.path).parent == Path(b)
    # LD_LIBRARY_PATH is only used with --use-env
    monkeypatch.setenv("LD_LIBRARY_PATH", b)
    leaf = child(audit(linkage_libs["both"]).tree, "libleaf.so")
    assert leaf.how == "runpath"
    opts = ResolveOptions.from_cli(use_env=True)
    report = check_paths([str(linkage_libs["both"])], policy(), opts)
    leaf = child(report.files[0].tree, "libleaf.so")
    assert leaf.how == "LD_LIBRARY_PATH" and Path(leaf.path).parent == Path(b)


def test_candidates_must_match_class_and_machine(linkage_libs):
    res = audit(linkage_libs["class"])
    wide = child(res.tree, "libwide.so")
    # the 32-bit libwide.so comes first in DT_RUNPATH and is skipped, as ld.so does
    assert Path(wide.path).parent == linkage_libs.root / "class/m64"


def test_a_cycle_terminates(linkage_libs):
    res = audit(linkage_libs["cycle"])
    b = child(res.tree, "libb.so")
    back = child(b, "liba.so")
    assert back.status == "loaded" and back.children == []
    assert res.verdict == "pass"


def test_sysroot_audit_resolves_inside_the_root(linkage_libs):
    root = linkage_libs["sysroot"]
    app = linkage_libs["sysroot_app"]
    res = audit(app, root=str(root))
    foo, bar, libc = (child(res.tree, n) for n in ("libfoo.so.1", "libbar.so.1", "libc.so.6"))
    # libfoo: from /opt/vendor/lib, named only by an included ld.so.conf.d file of the sysroot
    assert foo.how == "ld.so.conf" and foo.path == str(root / "opt/vendor/lib/libfoo.so.1")
    # libbar: /usr/lib/libbar.so.1 is an absolute symlink, followed inside the sysroot
    assert bar.how == "default" and bar.realpath == str(root / "opt/vendor/lib/libbar.so.1.0")
    assert libc.status == "trusted" and libc.path.startswith(str(root))
    assert res.verdict == "pass" and not [f for f in res.findings if f.kind == "unresolved"]
    # the same object audited against this machine finds neither vendor library
    host = audit(app)
    assert child(host.tree, "libfoo.so.1").status == "unresolved"


def test_symlink_loop_in_sysroot_is_not_followed_forever(tmp_path):
    (tmp_path / "lib").mkdir()
    os.symlink("/lib/b", tmp_path / "lib/a")
    os.symlink("/lib/a", tmp_path / "lib/b")
    assert Paths(str(tmp_path)).real(str(tmp_path / "lib/a")) is None


def test_ldso_conf_includes(tmp_path):
    (tmp_path / "etc/conf.d").mkdir(parents=True)
    (tmp_path / "etc/ld.so.conf").write_text("# comment\n/first\ninclude conf.d/*.conf\n/last # trailing\n")
    (tmp_path / "etc/conf.d/b.conf").write_text("/from_b\ninclude /etc/ld.so.conf\n")  # a loop
    (tmp_path / "etc/conf.d/a.conf").write_text("/from_a1 /from_a2\n")
    dirs, warnings = read_ldso_conf(Paths(str(tmp_path)), "/etc/ld.so.conf")
    assert dirs == ["/first", "/from_a1", "/from_a2", "/from_b", "/last"]
    assert any("loop" in w for w in warnings)


def test_dynamic_string_tokens():
    assert expand_dst("$ORIGIN/../lib", "/opt/x/bin", 64, 62) == "/opt/x/bin/../lib"
    assert expand_dst("${ORIGIN}/a:", "/o", 64, 62) == "/o/a:"
    assert expand_dst("/usr/$LIB", "/o", 64, 62) == "/usr/lib/x86_64-linux-gnu"
    assert expand_dst("$UNKNOWN/x", "/o", 64, 62) is None


def test_trusted_name_outside_system_dirs_is_inspected(tmp_path):
    """A vendor library renamed libm.so.6 next to the binary is looked into, not trusted."""
    fake = cc_shared(tmp_path / "shadow/libm.so.6", "int cublasSgemm_v2(void){return 0;}\n",
                     "-Wl,-soname,libm.so.6")
    user = cc_shared(tmp_path / "libuser.so", "int u(void){return 0;}\n", f"-L{fake.parent}", "-l:libm.so.6",
                     "-Wl,-rpath,$ORIGIN/shadow", "-Wl,--enable-new-dtags")
    res = audit(user)
    node = child(res.tree, "libm.so.6")
    assert node.status == "inspected" and "outside the system" in node.note
    hits = [f for f in res.failing if f.kind == "static-symbol"]
    assert hits and hits[0].rule == "nvidia.cublas" and hits[0].in_file == str(fake)
    assert hits[0].chain == ["libuser.so", "libm.so.6"]


def test_origin_is_the_directory_the_library_was_found_in_not_its_symlink_target(tmp_path):
    """glibc's $ORIGIN comes from the path it opened: a symlinked library sees the link's directory."""
    cc_shared(tmp_path / "links/sub/libleafx.so", "int leafx(void){return 0;}\n")
    real = cc_shared(tmp_path / "store/libreal.so", "int real(void){return 0;}\n",
                     f"-L{tmp_path / 'links/sub'}", "-lleafx", "-Wl,-rpath,$ORIGIN/sub", "-Wl,--enable-new-dtags",
                     "-Wl,-soname,libsym.so")
    os.symlink(real, tmp_path / "links/libsym.so")
    top = cc_shared(tmp_path / "libtop.so", "int top(void){return 0;}\n", f"-L{tmp_path / 'links'}", "-lsym",
                    "-Wl,-rpath,$ORIGIN/links", "-Wl,--enable-new-dtags")
    res = audit(top)
    sym = child(res.tree, "libsym.so")
    assert sym.realpath == str(real)
    leaf = child(sym, "libleafx.so")
    assert leaf.how == "runpath" and leaf.path == str(tmp_path / "links/sub/libleafx.so")
    assert ldd(top)["libleafx.so"] == leaf.path  # what glibc's loader itself finds


# ---- the glibc loader itself as the oracle ----------------------------------------------------

def ldd(path) -> dict[str, str | None]:
    """What the system's ld.so resolves (`ldd`, LD_LIBRARY_PATH unset): name -> path, None if not found."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run([require_tool("ldd"), str(path)], capture_output=True, text=True, env=env, check=False,
                         timeout=60).stdout
    got: dict[str, str | None] = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (?:not found|(\S+) \(0x[0-9a-f]+\))$", line)
        if m:
            got[m.group(1)] = m.group(2)
    return got


def ours(node, acc=None) -> dict[str, str | None]:
    """The same from our tree: first time each name is met, its path (None when unresolved)."""
    acc = {} if acc is None else acc
    for c in node.children:
        acc.setdefault(c.name, None if c.status == "unresolved" else c.path)
        ours(c, acc)
    return acc


@pytest.mark.parametrize("key", ["rpath_only", "runpath_only", "both", "class", "cycle"])
def test_resolution_agrees_with_the_glibc_loader(linkage_libs, key):
    ref = ldd(linkage_libs[key])
    mine = ours(audit(linkage_libs[key]).tree)
    fixtures = {n: p for n, p in ref.items() if p is None or p.startswith(str(linkage_libs.root))}
    assert fixtures, ref  # some fixture library is named, or this compares nothing
    for name, path in fixtures.items():
        assert name in mine, (name, mine)
        assert mine[name] == path, (name, mine[name], path)


def test_member_versions_found_by_soname_prefix_only():
    """A NEEDED `libfoo.so.1` falls back to a member `libfoo.so.1.2.3` (shipped without the symlink
    ldconfig would make), never to a name that merely shares the prefix."""
    from audit.linkage.resolution.ldso import Member, MemberSet

    names = ["b/libfoo.so.1.2.3", "a/libfoo.so.1.2.3", "libfoo.so.1", "libfoo.so.10", "libfoo.so.1a",
             "libfoo.so.x.1", "libfoo.so.1.2.3.bak", "libfoobar.so.1", "libfoo.so", "libfoo.so.1..2"]
    members = MemberSet("F", [Member(f"/t/{n}", f"F!{n}") for n in names])
    shown = lambda ms: [m.shown for m in ms]  # noqa: E731
    assert shown(members.versions_of("libfoo.so.1")) == ["F!libfoo.so.1..2", "F!a/libfoo.so.1.2.3",
                                                         "F!b/libfoo.so.1.2.3"]
    assert shown(members.versions_of("libfoo.so")) == ["F!libfoo.so.1", "F!libfoo.so.1..2", "F!a/libfoo.so.1.2.3",
                                                       "F!b/libfoo.so.1.2.3", "F!libfoo.so.10"]
    assert shown(members.versions_of("libfoo.so.1.2")) == ["F!a/libfoo.so.1.2.3", "F!b/libfoo.so.1.2.3"]
    assert members.versions_of("libfoo") == [] and members.versions_of("x/libfoo.so") == []
    assert shown(members.versions_of("libfoobar.so")) == ["F!libfoobar.so.1"]
