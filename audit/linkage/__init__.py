"""The linkage stage: ld.so-style resolution, the deny-list policy, findings and CI outputs.

Public API (what `run` and `inspect` use):
  audit.linkage.policy.load_policy(path_or_None) -> Policy       (PolicyError, exit 2)
  audit.linkage.check.check_paths(paths, policy, options) -> CheckReport
  audit.linkage.resolve.ResolveOptions                             (--root, --ldpath, --use-env)
  CheckReport.to_dict()  (schema sovereign-audit.linkage/1),  CheckReport.exit_code
  Policy.symbol_pattern  (ONE bytes regex for read_elf's bulk filter)
"""
