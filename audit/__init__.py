"""sovereign-audit: prove a GPU kernel build is sovereign, and that its performance claim holds.

Data flows build -> audit (linkage) -> evidence (parity, bench, pipeline) -> report;
each stage is a subpackage whose result is a dataclass the next stage consumes.
"""

__version__ = "0.1.0"
