"""Policy loading, validation (exit 2 naming file and key), extends, anchoring, policy show."""

from __future__ import annotations

import datetime as dt
import functools

import pytest
import tomllib

from audit.errors import EXIT_USAGE, PolicyError
from audit.linkage.judging.patterns import PatternError, glob_to_regex, soname_stem
from audit.linkage.judging.policy import load_policy, shipped_policies, to_toml
from cli_runner import cli

FAMILIES = {
    "AMD": ["rocBLAS", "hipBLAS", "hipBLASLt", "rocSOLVER", "rocSPARSE", "MIOpen", "composable_kernel",
            "AOTriton", "Tensile", "rocWMMA"],
    "NVIDIA": ["cuBLAS", "cuBLASLt", "cuDNN", "cuSPARSE", "cuSOLVER", "CUTLASS", "TensorRT"],
    "Intel": ["MKL", "oneDNN"],
    "BLAS/LAPACK": ["OpenBLAS", "BLIS", "ATLAS", "CBLAS / LAPACKE"],
    "attention": ["flash-attn", "xformers"],
}


@functools.lru_cache(maxsize=1)
def default_policy():
    return load_policy(None)  # read-only use below: loaded once per session


def write(tmp_path, text, name="p.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_default_policy_is_shipped_and_covers_every_family():
    assert "sovereign" in shipped_policies()
    pol = load_policy(None)
    names = {(r.family, r.name) for r in pol.rules}
    for family, members in FAMILIES.items():
        for member in members:
            assert (family, member) in names, f"{family} {member} missing"
    assert any(r.name.startswith("reference BLAS") for r in pol.rules)
    assert all(r.reason for r in pol.rules)
    assert pol.sources[0]["path"] == "sovereign (shipped)"


@pytest.mark.parametrize("soname, rule", [
    ("libcublas.so", "nvidia.cublas"), ("libcublas.so.12", "nvidia.cublas"),
    ("libcublas.so.12.4.5.8", "nvidia.cublas"), ("libcublasLt.so.12", "nvidia.cublaslt"),
    ("libcudnn.so.9", "nvidia.cudnn"), ("libcudnn_ops.so.9", "nvidia.cudnn"),
    ("librocblas.so.4", "amd.rocblas"), ("libhipblaslt.so.0", "amd.hipblaslt"), ("libMIOpen.so.1", "amd.miopen"),
    ("libopenblas.so.0", "blas.openblas"), ("libopenblasp-r0.3.21.so", "blas.openblas"),
    ("libmkl_rt.so.2", "intel.mkl"), ("libdnnl.so.3", "intel.onednn"), ("libblas.so.3", "blas.reference"),
    ("liblapack.so.3", "blas.reference"), ("libnvinfer.so.10", "nvidia.tensorrt"),
    ("flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so", "attention.flash-attn"),
])
def test_soname_globs_match_any_version_suffix(soname, rule):
    hit = default_policy().deny_rule_for_soname(soname)
    assert hit is not None and hit.id == rule


@pytest.mark.parametrize("soname", ["libamdhip64.so.5", "libcudart.so.12", "libcuda.so.1", "libc.so.6",
                                    "libstdc++.so.6", "libm.so.6", "libflash_kernel.so", "libcublasfoo.so"])
def test_base_runtime_and_system_libraries_are_not_denied(soname):
    assert default_policy().deny_rule_for_soname(soname) is None


def test_trusted_and_inspected_are_distinct():
    pol = default_policy()
    assert pol.is_trusted("libamdhip64.so.5") and pol.is_trusted("libcudart.so.12") and pol.is_trusted("libc.so.6")
    assert not pol.is_inspected("libamdhip64.so.5")
    assert pol.is_inspected("libflash_kernel.so") and not pol.is_trusted("libflash_kernel.so")


@pytest.mark.parametrize("name, rule", [
    ("cublasSgemm_v2", "nvidia.cublas"), ("cublasLtMatmul", "nvidia.cublaslt"), ("cudnnCreate", "nvidia.cudnn"),
    ("_ZN7cutlass4gemm6kernel4GemmIvEEvv", "nvidia.cutlass"), ("rocblas_sgemm", "amd.rocblas"),
    ("hipblasLtMatmul", "amd.hipblaslt"), ("hipblasSgemm", "amd.hipblas"), ("mkl_blas_sgemm", "intel.mkl"),
    ("dnnl_primitive_create", "intel.onednn"), ("sgemm_", "blas.reference"), ("zgemm_64_", "blas.reference"),
    ("cblas_dgemm", "blas.cblas"), ("openblas_set_num_threads", "blas.openblas"),
    ("_ZN2ck6tensor3fooEv", "amd.composable-kernel"), ("_ZN5flash13run_mha_fwd_EvR", "attention.flash-attn"),
])
def test_symbol_patterns_select_vendor_names(name, rule):
    pol = default_policy()
    hit = pol.rule_for_symbol(name)
    assert hit is not None and hit.id == rule
    assert pol.symbol_pattern.search(name.encode())  # the bulk filter keeps it too


@pytest.mark.parametrize("name", [
    "my_cublas_helper", "cublasfoo", "xsgemm_", "sgemm", "fk_attention_forward", "_ZN2fk7forwardEv",
    "_Z20my_cutlass_like_thingv", "not_mkl_thing", "dgemm_helper", "libcublas_wrapper_init",
    "_ZN8cutlassy3fooEv", "fk_flash_fwd_kernel",
])
def test_symbol_patterns_are_anchored_not_substrings(name):
    pol = default_policy()
    assert pol.rule_for_symbol(name) is None
    assert not pol.symbol_pattern.search(name.encode())


def test_bulk_pattern_never_spans_names_in_a_joined_table():
    import re

    pat = default_policy().symbol_pattern
    table = b"\0my_cublas_x\0cublasSgemm_v2\0fk_sgemm_\0dgemm_\0_ZN7cutlass3fooEv\0"
    joined = re.compile(pat.pattern, re.MULTILINE)  # what audit.elf.textscan does (NUL -> \n)
    hits = [m.group() for m in joined.finditer(table.replace(b"\0", b"\n"))]
    assert hits == [b"cublasSgemm_v2", b"dgemm_", b"_ZN7cutlass3fooEv"]


def test_glob_translation():
    assert soname_stem("libcublas.so.12.1") == "libcublas"
    assert soname_stem("/x/libfoo.so") == "libfoo"
    for bad in ["", "a[b", "lib foo", "x\x01"]:
        with pytest.raises(PatternError):
            glob_to_regex(bad)


@pytest.mark.parametrize("text, key", [
    ('name = "x"\nbogus = 1\n', "bogus"),
    ('[[rules]]\nid = "x.y"\nreason = "r"\nsonames = ["libx"]\nsonmaes = ["liby"]\n', "rules[0].sonmaes"),
    ('[[rules]]\nid = "x.y"\nsonames = ["libx"]\n', "reason"),
    ('[[rules]]\nid = "x.y"\nreason = "r"\nsymbols = ["cublas[A-Z"]\n', "rules[0] (id 'x.y').symbols[0]"),
    ('[[rules]]\nid = "x.y"\nreason = "r"\n', "needs at least one"),
    ('[settings]\nunresolved = "maybe"\n', "settings.unresolved"),
    ('[allow]\ntrusted = "libc"\n', "allow.trusted"),
    ('[[exceptions]]\nfile = "*"\nrule = "nvidia.cublas"\n', "reason"),
    ('[[exceptions]]\nfile = "*"\nrule = "no.such"\nreason = "r"\n', "exceptions[0].rule"),
    ('[[exceptions]]\nfile = "*"\nrule = "nvidia.cublas"\nreason = "r"\nexpires = "soon"\n', "expires"),
    ('name = [\n', "invalid TOML"),
    ('symbol-prefixes = ["scipy "]\n', "symbol-prefixes[0]"),
    ('symbol-suffixes = "64_"\n', "symbol-suffixes"),
])
def test_bad_policy_is_exit_2_naming_file_and_key(tmp_path, capsys, text, key):
    path = write(tmp_path, 'extends = "sovereign"\n' + text if "exceptions" in text else text)
    with pytest.raises(PolicyError) as exc:
        load_policy(path)
    assert str(path) in exc.value.message and key in exc.value.message
    rc, out, err = cli(capsys, "policy", "show", "--policy", str(path))
    assert rc == EXIT_USAGE
    assert err.startswith("error: ") and str(path) in err and key in err and err.count("\n") == 1


def test_missing_policy_file_is_exit_2(tmp_path, capsys):
    rc, _, err = cli(capsys, "check", "--policy", str(tmp_path / "nope.toml"), str(tmp_path))
    assert rc == EXIT_USAGE and "nope.toml" in err


def test_extends_inherits_overrides_and_detects_loops(tmp_path):
    child = write(tmp_path, 'extends = "sovereign"\nname = "strict"\n[settings]\nunresolved = "fail"\n'
                            '[allow]\ntrusted = ["libmything"]\n'
                            '[[rules]]\nid = "nvidia.cublas"\nreason = "redefined"\nsonames = ["libcublas"]\n'
                            '[[rules]]\nid = "local.thing"\nreason = "ours"\nsonames = ["libthing"]\n',
                  "child.toml")
    pol = load_policy(child)
    assert pol.name == "strict" and pol.settings["unresolved"] == "fail"
    assert pol.is_trusted("libmything.so.1") and pol.is_trusted("libc.so.6")
    ids = [r.id for r in pol.rules]
    assert ids.count("nvidia.cublas") == 1 and pol.rule("nvidia.cublas").reason == "redefined"
    assert ids[-1] == "local.thing" and "blas.openblas" in ids
    assert [s["path"] for s in pol.sources] == ["sovereign (shipped)", str(child)]
    # a relative extends is resolved beside the file; a loop is an error, not a hang
    write(tmp_path, 'extends = "b.toml"\n', "a.toml")
    write(tmp_path, 'extends = "a.toml"\n', "b.toml")
    with pytest.raises(PolicyError, match="loops back"):
        load_policy(tmp_path / "a.toml")
    with pytest.raises(PolicyError, match="no shipped policy"):
        load_policy(write(tmp_path, 'extends = "nonexistent"\n', "c.toml"))


def test_exception_fields(tmp_path):
    path = write(tmp_path, 'extends = "sovereign"\n[[exceptions]]\nfile = "vendor/*.so"\nrule = "blas.openblas"\n'
                           'reason = "temporary"\nexpires = 2001-02-03\n')
    exc = load_policy(path).exceptions[0]
    assert exc.expires == dt.date(2001, 2, 3) and exc.expired(dt.date(2026, 1, 1))
    assert exc.matches("vendor/libx.so", "blas.openblas") and not exc.matches("other/libx.so", "blas.openblas")
    assert not exc.matches("vendor/libx.so", "nvidia.cublas")


def test_policy_show_round_trips(tmp_path, capsys):
    rc, out, _ = cli(capsys, "policy", "show")
    assert rc == 0
    doc = tomllib.loads(out)
    assert doc["name"] == "sovereign" and len(doc["rules"]) == len(load_policy(None).rules)
    shown = write(tmp_path, out, "shown.toml")
    again = load_policy(shown)
    base = load_policy(None)
    assert [r.to_dict() | {"source": ""} for r in again.rules] == [r.to_dict() | {"source": ""} for r in base.rules]
    assert again.trusted == base.trusted and again.inspected == base.inspected and again.settings == base.settings
    assert (again.symbol_prefixes, again.symbol_suffixes) == (base.symbol_prefixes, base.symbol_suffixes) == (("scipy_",), ("64_",))
    rc, out, _ = cli(capsys, "policy", "show", "--json")
    assert rc == 0 and '"nvidia.cublas"' in out
    rc, out, _ = cli(capsys, "policy", "list")
    assert rc == 0 and "sovereign" in out.split()


def test_to_toml_escapes_untrusted_text(tmp_path):
    path = write(tmp_path, '[[rules]]\nid = "x.y"\nreason = "quote \\" back \\\\ ctl \\u0007"\nsonames = ["libx"]\n')
    pol = load_policy(path)
    again = load_policy(write(tmp_path, to_toml(pol), "again.toml"))
    assert again.rules[0].reason == 'quote " back \\ ctl \x07'


def test_symbol_prefixes_and_suffixes_extend_and_rename_only_c_patterns(tmp_path):
    path = write(tmp_path, 'extends = "sovereign"\nsymbol-prefixes = ["mkl_"]\n'
                           '[[rules]]\nid = "x.y"\nreason = "r"\nsymbols = ["fkv_gemm_", "fkv_[a-z]*", "_ZN3fkv*"]\n')
    pol = load_policy(path)
    assert pol.symbol_prefixes == ("scipy_", "mkl_") and pol.symbol_suffixes == ("64_",)
    assert pol.rule("x.y").match_symbols == (
        "fkv_gemm_", "fkv_[a-z]*", "_ZN3fkv*", "fkv_gemm_64_", "scipy_fkv_gemm_", "scipy_fkv_gemm_64_",
        "mkl_fkv_gemm_", "mkl_fkv_gemm_64_", "scipy_fkv_[a-z]*", "mkl_fkv_[a-z]*")
    assert pol.rule_for_symbol("scipy_fkv_gemm_64_").id == "x.y"
    assert pol.rule_for_symbol("scipy__ZN3fkv1fEv") is None  # C++ names are never renamed so


def test_regexes_left_for_first_use_are_those_prepare_makes():
    """finalize compiles only the reader's bulk filter; the other regexes come on first use or
    all at once from prepare (check runs it while the reader's helpers read): the same either way."""
    lazy, ready = load_policy(None), load_policy(None)
    ready.prepare()
    assert lazy._re._recipes and all(r._re._recipes for r in lazy.rules)  # nothing else compiled yet
    assert not ready._re._recipes and not any(r._re._recipes for r in ready.rules)
    for a, b in zip([lazy] + lazy.rules, [ready] + ready.rules):
        for key in sorted(set(b._re) - {"soname_memo"}):
            got, want = a._re.get(key), b._re.get(key)
            assert (got and got.pattern) == (want and want.pattern), key
    names = ["cublasCreate_v2", "cblas_daxpy", "_ZN4dnnl6engineC2Ev", "mkl_free", "unrelated", "dgemm_"]
    assert {n: r.id for n, r in lazy.classify_symbols(names).items()} == \
        {n: r.id for n, r in ready.classify_symbols(names).items()}


def test_prepare_without_device_code_leaves_only_the_kernel_regexes():
    """For a file without GPU code, prepare leaves the kernel patterns (half its work) for first
    use; judging a kernel afterwards still gives what a fully prepared policy gives."""
    host, ready = load_policy(None), load_policy(None)
    host.prepare(device_code=False)
    ready.prepare()
    assert set(host._re._recipes) == {"by_kernels", "by_shared"}
    assert all(set(r._re._recipes) == {"kernels", "shared_kernels", "device"} for r in host.rules)
    kernels = ["_ZN7cutlass6KernelINS_4gemmEEEvNT_6ParamsE", "sm80_xmma_gemm_f16f16_cudnn", "sm90_xmma_gemm_f16",
               "_Z20flash_fwd_kernel_v2Pv", "my_own_kernel"]
    shipper = ready.deny_rule_for_soname("libcudnn_engines_precompiled.so.9")
    for name in kernels:
        for ship in (None, shipper):
            got, want = host.rule_for_kernel(name, ship), ready.rule_for_kernel(name, ship)
            assert (got and got.id) == (want and want.id), name
    assert ready.rule_for_kernel("sm80_xmma_gemm_f16f16_cudnn") is not None  # the names above do reach rules


def test_name_lists_in_every_renamed_form_and_the_first_listing_rule_owns_a_name(tmp_path):
    """A symbol list's names are matched as written and as a renaming build spells them
    (prefix, suffix, both), C++ names never renamed; a name two rules list is the earlier one's."""
    (tmp_path / "a.names").write_text("dgemm_\n_ZN3fkv1fEv\nshared_name\n")
    (tmp_path / "b.names").write_text("shared_name\nzgemm_\n")
    path = write(tmp_path, 'symbol-prefixes = ["scipy_", "x_"]\nsymbol-suffixes = ["64_"]\n'
                           '[[rules]]\nid = "a.a"\nreason = "r"\nsymbol-lists = ["a.names"]\n'
                           '[[rules]]\nid = "b.b"\nreason = "r"\nsymbol-lists = ["b.names"]\n')
    pol = load_policy(path)
    forms = {pre + n + suf for n in ("dgemm_", "shared_name") for pre in ("", "scipy_", "x_") for suf in ("", "64_")}
    assert pol.rule("a.a").match_names == frozenset(forms | {"_ZN3fkv1fEv"})
    assert pol.rule_for_symbol("x_dgemm_64_").id == "a.a"
    assert pol.rule_for_symbol("scipy_shared_name").id == "a.a"  # listed by both: the first rule's
    assert pol.rule_for_symbol("scipy_zgemm_64_").id == "b.b"
    assert pol.rule_for_symbol("scipy__ZN3fkv1fEv") is None
