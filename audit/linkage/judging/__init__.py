"""Judging one binary and its tree against a policy: the policy and its patterns, the findings
(`scan.py`), one finding per rule and mechanism (`group.py`), baselines of known findings."""
