"""The `check` and `policy` commands (thin: the logic is in check.py, policy.py, outputs.py)."""

from __future__ import annotations

import gc
import json
import os

import click

from audit.elf import idle
from audit.elf.quiet_numpy import import_numpy
from audit.errors import UsageError

# Outputs that carry each file's sha256 (JSON and SARIF list it; JUnit reads it as "the file was
# read"): the files are hashed only when one of them is asked for.
HASHED_FORMATS = frozenset({"json", "sarif", "junit", "cyclonedx", "spdx"})


@click.command("check")
# readable=False: an unreadable input is the audit's to report (exit 3), not Click's usage error (2)
@click.argument("paths", nargs=-1, required=True, type=click.Path(readable=False))
@click.option("--policy", "policy_path", metavar="FILE",
              help="Policy file or shipped policy name (default: sovereign).")
@click.option("--format", "formats", multiple=True, metavar="FMT[=FILE]",
              help="text, json, sarif, junit, github, cyclonedx or spdx (examples above); =FILE writes there "
                   "instead of stdout. Repeatable.")
@click.option("--root", metavar="DIR", help="Sysroot: resolve libraries inside DIR (hermetic audit).")
@click.option("--ldpath", multiple=True, metavar="DIR", help="Extra library directory (like LD_LIBRARY_PATH). Repeatable.")
@click.option("--use-env", is_flag=True,
              help="Also search $LD_LIBRARY_PATH, and judge what $LD_PRELOAD loads (both ignored by default).")
@click.option("--conda-prefix", metavar="DIR",
              help="Conda environment that conda packages are installed into: their libraries also resolve in DIR/lib.")
@click.option("--baseline", "baseline_path", metavar="FILE",
              help="An earlier `--format json` result: its findings are known (shown as baseline, exit 0); "
                   "only new ones fail.")
@click.option("--write-baseline", metavar="FILE", help="Write this run's findings as a baseline (JSON) to FILE.")
@click.option("--jobs", "-j", default=None, metavar="N",
              help="Processes to audit with (default: one per core when there is enough to read).")
@click.option("--max-member-size", default="4G", show_default=True, metavar="SIZE",
              help="Refuse an archive member that unpacks to more than SIZE (e.g. 512M, 4G).")
@click.option("--max-member-ratio", default="100", show_default=True, metavar="N",
              help="Refuse an archive member of 64 MiB or more compressed more than N:1.")
@click.option("--max-archive-size", default="16G", show_default=True, metavar="SIZE",
              help="Refuse an archive whose ELF members unpack to more than SIZE in all.")
@click.option("-v", "--verbose", is_flag=True,
              help="Text lists every match of every finding, not a few examples, and long names and notes uncut.")
@click.option("--timing", is_flag=True,
              help="Record the elapsed time (text, JSON, JUnit). Off by default: the same input gives the same bytes.")
@click.option("--attest", "attest_path", metavar="FILE",
              help="Write the verdict as a signed SLSA verification summary (DSSE, in-toto; name it *.intoto.jsonl).")
@click.option("--key", "key_path", metavar="KEY",
              help="Ed25519 PKCS#8 PEM key to sign --attest with (else $SOVEREIGN_AUDIT_SIGNING_KEY, else an "
                   "ephemeral key whose public half is written to FILE.pub).")
@click.option("--resource-uri", metavar="URI",
              help="What --attest's verdict is about, e.g. pkg:pypi/NAME@VERSION or an image reference "
                   "(default: the purl of one wheel, else the one PATH).")
@click.pass_context
def check_cmd(ctx, paths, policy_path, formats, root, ldpath, use_env, conda_prefix, baseline_path, write_baseline,
              jobs, max_member_size, max_member_ratio, max_archive_size, verbose, timing, attest_path, key_path,
              resource_uri):
    """Fail if PATH... links, loads or embeds a denied vendor library.

    PATH is an ELF file, a directory (searched recursively; the wheels, zip archives, conda
    packages and images in it are audited too, other non-ELF files are skipped and counted), a
    wheel or any zip archive (a jar, an egg: its members, jars in it too), a Debian package
    (.deb: the files its data.tar installs), a tarball (an sdist: its binaries, archives and Python
    loaders), a conda package (.conda, .tar.bz2) or a container image (a `docker save`
    / `podman save` tar, or an OCI image layout as a directory or tar: its final filesystem is
    audited, resolved inside the image; --root, --ldpath and --use-env do not apply to it).
    Exit codes: 0 clean, 1 violation, 2 usage or policy error, 3 an input that could not be
    read or parsed (an archive member over a --max-* limit too), or no ELF file found.

    One finding per rule, evidence kind and object, with a count and examples; text
    groups by file, then rule (-v lists every match; JSON always has them all).

    \b
    Output formats (--format, repeatable; each to stdout or =FILE):
      text     the log, per file with why-chains   --format text
      json     the full result (a baseline too)    --format json=linkage.json
      sarif    SARIF 2.1.0 for code scanning       --format sarif=linkage.sarif
      junit    JUnit XML, one test per file/rule   --format junit=linkage.xml
      github   workflow annotations + job summary  --format github
      cyclonedx CycloneDX 1.6 SBOM (docs/sbom.md)  --format cyclonedx=sbom.cdx.json
      spdx     SPDX 2.3 SBOM (docs/sbom.md)        --format spdx=sbom.spdx.json
    \b
    A signed verdict for other tools (verify with `sovereign-audit verify-attestation`):
      sovereign-audit check dist/x.whl --attest check.intoto.jsonl --key signing.key
    \b
    Adopting a policy in a repository that already has findings:
      sovereign-audit check dist/ --write-baseline linkage-baseline.json
      sovereign-audit check dist/ --baseline linkage-baseline.json
    """
    idle.mark()  # whether a CPU stays free meanwhile decides on the reader's forked child (audit.elf.idle)
    # A short run that builds many small containers (the policy's regexes, symbol columns, findings)
    # and few reference cycles: the collector runs less often (~7 passes instead of ~120 on
    # libtorch_cpu.so, tens of milliseconds).
    gc.set_threshold(10_000, 10, 10)
    from audit.linkage.outputs.write import (
        OutputSpec,
        check_destinations,
        parse_format,
        write_outputs,
    )

    specs = [parse_format(f) for f in formats]
    if write_baseline is not None:
        specs = (specs or [OutputSpec("text")]) + [OutputSpec("json", write_baseline)]
    # Each file's sha256 only where an output carries it: the text log and the GitHub
    # annotations show none, and hashing libtorch_cpu.so's 434 MB costs more CPU than reading it.
    sha256 = any(spec.format in HASHED_FORMATS for spec in specs) or attest_path is not None
    if sha256 and len(paths) == 1 and os.path.isfile(paths[0]):  # one large ELF file: hashed while the rest loads
        from audit.elf.hashing import prefetch

        prefetch(paths[0])
    import_numpy()  # before the reader imports it: no BLAS threads (check multiplies no matrices)
    from audit.linkage.judging.baseline import apply_baseline, load_baseline
    from audit.linkage.check import check_paths
    from audit.linkage.containers.inputs import ArchiveLimits
    from audit.linkage.judging.policy import load_policy
    from audit.linkage.resolution.ldso import ResolveOptions

    check_destinations(specs + _attest_outputs(attest_path, key_path, resource_uri, paths))
    signing_key = _attest_key(attest_path, key_path)
    if root is not None and not os.path.isdir(root):
        raise UsageError(f"--root {root}: not a directory")
    for d in ldpath:
        if not os.path.isdir(d):
            raise UsageError(f"--ldpath {d}: not a directory")
    if conda_prefix is not None and not os.path.isdir(conda_prefix):
        raise UsageError(f"--conda-prefix {conda_prefix}: not a directory")
    limits = ArchiveLimits(member_bytes=parse_size(max_member_size, "--max-member-size"),
                           ratio=_number(max_member_ratio, "--max-member-ratio", float, 1),
                           total_bytes=parse_size(max_archive_size, "--max-archive-size"))
    jobs = None if jobs is None else _number(jobs, "--jobs", int, 1)
    policy = load_policy(policy_path)
    baseline = load_baseline(baseline_path) if baseline_path is not None else None
    report = check_paths(list(paths), policy, ResolveOptions.from_cli(root, ldpath, use_env, conda_prefix),
                         jobs=jobs, limits=limits, timing=timing, sha256=sha256)
    if baseline is not None:
        apply_baseline(report, baseline)
    write_outputs(report, policy, specs, verbose)
    if attest_path is not None:
        _attest(report, attest_path, signing_key, resource_uri, specs)
    ctx.exit(report.exit_code)


def _attest_outputs(attest_path, key_path, resource_uri, paths) -> list:
    """--attest's file (and an ephemeral key's FILE.pub) as outputs whose folders are checked
    with the others before any work; --key and --resource-uri without --attest are refused."""
    from audit.linkage.outputs.write import OutputSpec

    if attest_path is None:
        for option, value in (("--key", key_path), ("--resource-uri", resource_uri)):
            if value is not None:
                raise UsageError(f"{option} signs or names --attest's verdict: give --attest FILE too")
        return []
    if not attest_path:
        raise UsageError("--attest: empty file name")
    from audit.linkage.outputs.attestation import default_resource_uri, source_date_epoch

    source_date_epoch()  # a malformed $SOURCE_DATE_EPOCH is refused before the audit
    if resource_uri is None and default_resource_uri(list(paths)) is None:
        raise UsageError("--attest with several PATHs: name what the verdict is about with --resource-uri URI")
    return [OutputSpec("attest", attest_path), OutputSpec("attest key", attest_path + ".pub")]


def _attest_key(attest_path, key_path):
    """The key to sign --attest with, loaded before the audit so a bad key costs no time."""
    if attest_path is None:
        return None
    from audit.signing.keys import load_signing_key

    return load_signing_key(key_path)


def _attest(report, attest_path, key, resource_uri, specs) -> None:
    from audit.errors import printable
    from audit.linkage.outputs.attestation import write_attestation

    written = [(s.format, s.file) for s in specs if s.file is not None]
    result = write_attestation(attest_path, report, key, resource_uri, written)
    if result.ephemeral:
        click.echo(f"note: {printable(attest_path)} is signed with an ephemeral key (integrity only, no identity); "
                   f"its public key is {printable(result.public_key_path)}", err=True)


def _number(text: str, option: str, kind, least):
    try:
        value = kind(text)
    except ValueError:
        raise UsageError(f"{option} {text}: not a number") from None
    if not value >= least or value == float("inf"):
        raise UsageError(f"{option} {text}: must be at least {least}")
    return value


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, option: str) -> int:
    """"4G" -> 4294967296 (binary units K, M, G, T, an optional trailing B or iB; plain bytes)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    try:
        value = float(t[:-1] if unit else t)
    except ValueError:
        raise UsageError(f"{option} {text}: not a size (e.g. 512M, 4G)") from None
    if not value > 0 or value != value or value == float("inf"):
        raise UsageError(f"{option} {text}: must be a positive size")
    return int(value * _UNITS[unit])


@click.group("policy")
def policy_group():
    """Show and list deny-list policies."""


@policy_group.command("show")
@click.option("--policy", "policy_path", metavar="FILE", help="Policy file or shipped policy name (default: sovereign).")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of TOML.")
def policy_show(policy_path, as_json):
    """Print the effective policy (with `extends` resolved)."""
    from audit.errors import no_commands
    from audit.linkage.judging.policy import load_policy, to_toml

    policy = load_policy(policy_path)
    if as_json:
        # the policy's text is untrusted: no line of it may be a CI runner's command
        click.echo(no_commands(json.dumps(policy.to_dict(), indent=2, ensure_ascii=True), "\\u003a", "\\u005b"))
    else:
        click.echo(to_toml(policy), nl=False)


@policy_group.command("list")
def policy_list():
    """List the policies shipped with sovereign-audit."""
    from audit.linkage.judging.policy import shipped_policies

    for name in shipped_policies():
        click.echo(name)
