"""Structure-aware mutation fuzzer of the gate's contract: `python3 -m bench.fuzz --help`.

Every case (a mutated ELF, folder, wheel, conda package, container image, policy or baseline) is
run through `check` (text, json, sarif and junit in one run; github in another) and `inspect`
(text and --json), each in its own process with a wall-clock limit, its peak RSS measured and an
audit hook watching a canary folder; contract.py lists what is checked. Each violation is saved
as a reproducer (the inputs and repro.sh) under OUT/violations/KIND/; the exit status is 1 when
there is any.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "bench.fuzz"

from . import archmut, contract, elfmut, seeds  # noqa: E402
from .execute import REPO, Runner  # noqa: E402

FAMILIES = {"elf": 34, "folder": 10, "wheel": 15, "conda": 13, "image": 15, "policy": 6, "baseline": 7}
KEEP_PER_KIND = 5


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python3 -m bench.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="the run's seed (default: random, printed)")
    ap.add_argument("--cases", type=int, default=0, help="stop after N cases (0: only --seconds bounds it)")
    ap.add_argument("--seconds", type=float, default=0, help="stop after this many seconds (0: only --cases)")
    ap.add_argument("--out", default="out/fuzz", help="where reproducers and the summary go")
    ap.add_argument("--jobs", type=int, default=1, help="cases run side by side")
    ap.add_argument("--cache", default=os.environ.get("SOVEREIGN_FUZZ_CACHE", str(REPO / "tests/_fixtures_build/fuzz-seeds")),
                    help="where the seeds are built once")
    ap.add_argument("--timeout", type=float, default=20, help="wall-clock limit of one run, seconds")
    ap.add_argument("--rss-mb", type=int, default=1024, help="peak RSS bound of one run, MiB")
    ap.add_argument("--mode", choices=["fork", "exec"], default="fork",
                    help="fork: runs fork a process with the CLI imported (fast); exec: a fresh python3 -m audit each")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset of " + ",".join(FAMILIES))
    ap.add_argument("--no-feedback", action="store_true", help="no corpus of mutants with new outcomes")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    if not a.cases and not a.seconds:
        ap.error("give --cases, --seconds or both")
    return a


def materialize(files: list, top: Path) -> None:
    top.mkdir(parents=True, exist_ok=True)
    for entry in files:
        kind, rel = entry[0], entry[1]
        p = os.path.join(os.fsencode(str(top)), os.fsencode(rel))
        parent = os.path.dirname(p)
        if parent and not os.path.isdir(parent):
            os.makedirs(parent, exist_ok=True)
        try:
            if kind == "dir":
                os.makedirs(p, exist_ok=True)
            elif kind == "file":
                with open(p, "wb") as fh:
                    fh.write(entry[2])
            elif kind == "symlink":
                os.symlink(entry[2], p)
            elif kind == "fifo":
                os.mkfifo(p)
        except OSError:  # a name this file system refuses (too long): the case goes without it
            pass


def plant_canary(canary: Path, seed_bytes: dict[str, bytes]) -> None:
    if canary.exists():
        shutil.rmtree(canary)
    (canary / "etc").mkdir(parents=True)
    (canary / "dir").mkdir()
    (canary / "secret.so").write_bytes(seed_bytes.get("static_cublas", seed_bytes["dep"]))
    (canary / "etc/ld.so.conf").write_text("/usr/lib\n")
    (canary / "x.conf").write_text("/usr/lib\n")


def commands(case: archmut.Case, ins: list[str], in_dir: str, jobs_flag: list[str],
             key: str) -> list[tuple[str, list, str, dict]]:
    """(tag, argv, format for the contract, extra env) of each run of a case."""
    sub = lambda args: [a.replace("@IN@", in_dir) for a in args]  # noqa: E731
    runs = [("check", ["check", *ins, "--format", "text", "--format", "json=out.json", "--format", "sarif=out.sarif",
                       "--format", "junit=out.xml", "--format", "cyclonedx=out.cdx.json", "--format", "spdx=out.spdx.json",
                       "--attest", "out.intoto.jsonl", "--key", key, *jobs_flag, *sub(case.check_args)], "text", {}),
            ("github", ["check", *ins, "--format", "github", *sub(case.check_args)], "github",
             {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": "summary.md"})]
    if case.family != "baseline":
        runs += [("inspect", ["inspect", *ins, *sub(case.inspect_args)], "inspect", {}),
                 ("inspect-json", ["inspect", "--json", *ins, *sub(case.inspect_args)], "json", {})]
    return runs


def signature(case, outcomes) -> tuple:
    words = []
    for o in outcomes:
        line = next((ln for ln in o.stderr.decode("utf-8", "replace").splitlines() if ln.startswith("error:")), "")
        words.append(re.sub(r"[0-9a-fx]{2,}|/\S*", "", line.split(":", 2)[-1])[:60])
    return (case.family, tuple(o.rc for o in outcomes), tuple(words))


def run_case(i: int, a, builder_args, runner: Runner, work: Path, corpus: list, seen: set, policy_text: str):
    runner.refresh()
    rng = random.Random(f"{a.seed}:{i}")
    em = elfmut.ElfMutator(rng)
    em.layouts = builder_args["layouts"]
    b = archmut.Builder(rng, builder_args["seeds"], em, builder_args["canary"])
    fams = [f for f in a.families.split(",") if f in FAMILIES]
    family = rng.choices(fams, weights=[FAMILIES[f] for f in fams])[0]
    try:
        case = {"elf": lambda: b.elf_case(corpus), "folder": b.folder_case, "wheel": b.wheel_case,
                "conda": b.conda_case, "image": b.image_case, "policy": lambda: b.policy_case(policy_text),
                "baseline": b.baseline_case}[family]()
    except Exception as exc:  # the fuzzer's own bug: counted, never the end of the run
        case = archmut.Case(family, notes=[f"case not built: {type(exc).__name__}: {exc}"[:200]])
        case.rcs = []
        return case, {"fuzzer-error": case.notes[0]}, [], work / f"c{i}", False
    case_dir = work / f"c{i}"
    if case_dir.exists():
        shutil.rmtree(case_dir)
    in_dir, cwd, tmp = case_dir / "in", case_dir / "cwd", case_dir / "tmp"
    materialize(case.files, in_dir)
    cwd.mkdir()
    tmp.mkdir()
    ins = [os.fsdecode(os.path.join(os.fsencode(str(in_dir)), os.fsencode(x))) for x in case.inputs]
    jobs_flag = ["--jobs", "2"] if rng.random() < 0.1 else []
    allowed = {0, 1, 3} | ({2} if case.usage_ok else set())
    canary_before = contract.snapshot(builder_args["canary"])
    violations, outcomes, argvs = [], [], []
    for tag, argv, fmt, env in commands(case, ins, str(in_dir), jobs_flag, builder_args["key"]):
        for leftover in ("out.json", "out.sarif", "out.xml", "out.cdx.json", "out.spdx.json", "out.intoto.jsonl",
                         "summary.md"):
            (cwd / leftover).unlink(missing_ok=True)
        env = dict(env, TMPDIR=str(tmp))
        if "GITHUB_STEP_SUMMARY" in env:  # the runner creates it before the step
            env["GITHUB_STEP_SUMMARY"] = str(cwd / env["GITHUB_STEP_SUMMARY"])
            (cwd / "summary.md").touch()
        o = runner.run(argv, str(case_dir), str(cwd), env, tag)
        outcomes.append(o)
        argvs.append((tag, argv, env))
        violations += contract.check_run(tag, o, allowed, fmt, a.rss_mb * 1024)
        if tag == "check" and o.rc is not None:
            violations += contract.check_files(tag, str(cwd), o.rc)
        if tag == "inspect-json":
            violations += contract.check_json_stdout(tag, o)
        left = os.listdir(tmp)
        if left and not o.timed_out:
            violations.append(("temp-left", f"{tag}: {len(left)} entries left in TMPDIR, e.g. {left[0]!a}"))
        for name in left:
            p = tmp / name
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    if outcomes[0].rc is not None and outcomes[1].rc is not None and outcomes[0].rc != outcomes[1].rc:
        violations.append(("verdict-mismatch", f"check exit {outcomes[0].rc} with text/json, {outcomes[1].rc} with github"))
    if contract.snapshot(builder_args["canary"]) != canary_before:
        violations.append(("write-outside", "the canary folder changed"))
        plant_canary(Path(builder_args["canary"]), builder_args["seeds"])
    # one of each kind per case
    kinds: dict[str, str] = {}
    for kind, detail in violations:
        kinds.setdefault(kind, detail)
    new = False
    if not a.no_feedback and case.primary is not None and case.family == "elf":
        sig = signature(case, outcomes)
        if sig not in seen:
            seen.add(sig)
            corpus.append(case.primary)
            del corpus[:-200]
            new = True
    case.rcs = [o.rc for o in outcomes]
    return case, kinds, argvs, case_dir, new


def save_repro(out: Path, kind: str, i: int, case, argvs, detail: str, canary: str) -> str:
    dest = out / "violations" / kind / f"case-{i}"
    if dest.exists():
        shutil.rmtree(dest)
    materialize(case.files, dest / "in")
    lines = ["#!/bin/sh", "# " + detail.replace("\n", " ")[:300], "# " + "; ".join(case.notes)[:600].replace("\n", " "),
             'cd "$(dirname "$0")" && mkdir -p cwd tmp && cd cwd', f"mkdir -p {canary}  # the canary folder no run may open",
             "export TMPDIR=../tmp"]
    for tag, argv, env in argvs:
        args = [x.replace(str(out / "work"), "..") for x in argv]
        args = [re.sub(r"^.*/c\d+/in", "../in", x) for x in args]
        envs = " ".join(f"{k}={'$PWD/summary.md' if k.endswith('SUMMARY') else v}" for k, v in env.items()
                        if k.startswith("GITHUB"))
        if envs:
            lines.append(": > summary.md")
        lines.append(f"{envs + ' ' if envs else ''}python3 -m audit {' '.join(_sh(x) for x in args)}; echo \"{tag}: exit $?\"")
    # file names may hold bytes that are not UTF-8 (os.fsdecode's surrogates): written back as those bytes
    (dest / "repro.sh").write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
    os.chmod(dest / "repro.sh", 0o755)
    (dest / "case.json").write_text(json.dumps({"case": i, "family": case.family, "kind": kind, "detail": detail,
                                                "notes": case.notes, "runs": [a for _t, a, _e in argvs]}, indent=1,
                                               ensure_ascii=True, default=str))
    return str(dest.relative_to(out))


def _sh(s: str) -> str:
    if re.fullmatch(r"[\w@%+=:,./-]+", s):
        return s
    return "'" + s.replace("'", "'\"'\"'") + "'"


def worker(w: int, a, shared, runner: Runner, out: Path, deadline: float, results: Path, policy_text: str) -> None:
    work = out / "work" / f"w{w}"
    work.mkdir(parents=True, exist_ok=True)
    corpus: list[bytes] = []
    seen: set = set()
    kept: Counter = Counter()
    i = w
    with open(results, "w") as res:
        while (not a.cases or i < a.cases) and (not a.seconds or time.monotonic() < deadline):
            t0 = time.monotonic()
            case, kinds, argvs, case_dir, new = run_case(i, a, shared, runner, work, corpus, seen, policy_text)
            rec = {"case": i, "family": case.family, "kinds": kinds, "notes": case.notes, "new": new, "repro": {},
                   "seconds": round(time.monotonic() - t0, 2), "rcs": case.rcs}
            for kind, detail in kinds.items():
                if kept[kind] < KEEP_PER_KIND:
                    kept[kind] += 1
                    rec["repro"][kind] = save_repro(out, kind, i, case, argvs, detail, shared["canary"])
            res.write(json.dumps(rec, ensure_ascii=True) + "\n")
            res.flush()
            shutil.rmtree(case_dir, ignore_errors=True)
            if not a.quiet and kinds:
                print(f"case {i} ({case.family}): " + ", ".join(kinds), flush=True)
            i += a.jobs


def summarize(out: Path, recs: list[dict], seconds: float, seed: int, notes: list[str]) -> tuple[str, int]:
    fam = Counter(r["family"] for r in recs)
    by_kind: dict[str, list[dict]] = {}
    for r in recs:
        for k in r["kinds"]:
            by_kind.setdefault(k, []).append(r)
    lines = [f"seed {seed}: {len(recs)} cases in {seconds:.0f} s ({', '.join(f'{k} {v}' for k, v in sorted(fam.items()))})"]
    lines += [f"note: {n}" for n in notes]
    if recs:
        rcs = Counter(rc for r in recs for rc in r.get("rcs", []))
        lines.append("exit codes of all runs: " + ", ".join(f"{k}: {v}" for k, v in sorted(rcs.items(), key=str)))
        slow = max(recs, key=lambda r: r.get("seconds", 0))
        kept = sum(1 for r in recs if r.get("new"))
        lines.append(f"slowest case {slow['case']} ({slow['family']}): {slow.get('seconds', 0)} s; "
                     f"{kept} mutant(s) with a new outcome kept for further mutation")
    if not by_kind:
        lines.append("no contract violation")
    else:
        lines.append(f"{sum(1 for r in recs if r['kinds'])} case(s) with violations:")
        lines.append(f"{'kind':<18} {'cases':>5}  example (reproducer; what the case was; what broke)")
        for k, rs in sorted(by_kind.items(), key=lambda kv: -len(kv[1])):
            ex = next((r for r in rs if k in r["repro"]), rs[0])
            what = "; ".join(ex["notes"])[:140].replace("\n", " ")
            lines.append(f"{k:<18} {len(rs):>5}  {ex['repro'].get(k, '-')} [{ex['family']}: {what}] {ex['kinds'][k][:160]}")
    text = "\n".join(lines)
    (out / "summary.txt").write_text(text + "\n")
    return text, len(by_kind)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1 << 31)
    out = Path(a.out).resolve()
    for old in ("violations", "work"):
        shutil.rmtree(out / old, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    seed_bytes, notes = seeds.load(Path(a.cache), log=(lambda m: None) if a.quiet else print)
    canary = out / "canary"
    plant_canary(canary, seed_bytes)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "LD_", "PYTHONSTARTUP"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # an import writing a .pyc is not the tool writing outside
    bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        return _run(a, out, seed_bytes, notes, canary, env)
    finally:
        sys.dont_write_bytecode = bytecode


def _run(a, out: Path, seed_bytes, notes, canary: Path, env) -> int:
    policy_text = (REPO / "policies/sovereign.toml").read_text()
    runner = Runner(a.mode, str(canary), a.timeout, env)
    shared = {"seeds": seed_bytes, "canary": str(canary), "layouts": {}}
    from audit.signing.keys import generate_keypair, write_keypair

    # --attest signs with this key (an ephemeral one would add a note line to every run's stderr)
    shared["key"] = str(write_keypair(out / "attest", generate_keypair(), force=True)[0])
    start = time.monotonic()
    deadline = start + a.seconds if a.seconds else float("inf")
    if not a.quiet:
        print(f"fuzz: seed {a.seed}, {a.cases or 'unbounded'} cases, {a.seconds or 'no'} second budget, "
              f"{a.jobs} job(s), out {out}", flush=True)
    pids = []
    for w in range(a.jobs):
        results = out / f"results-{w}.jsonl"
        if a.jobs == 1:
            worker(0, a, shared, runner, out, deadline, results, policy_text)
            break
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                worker(w, a, shared, runner, out, deadline, results, policy_text)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    recs = []
    for w in range(a.jobs):
        p = out / f"results-{w}.jsonl"
        if p.exists():
            recs += [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]
    recs.sort(key=lambda r: r["case"])
    shutil.rmtree(out / "work", ignore_errors=True)
    text, kinds = summarize(out, recs, time.monotonic() - start, a.seed, notes)
    print(text)
    return 1 if kinds else 0


if __name__ == "__main__":
    sys.exit(main())
