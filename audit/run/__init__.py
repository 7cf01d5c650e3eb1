"""The whole job, `sovereign-audit run`: build -> linkage -> evidence -> report, into one bundle.

This package sits above the stages: it calls each stage's API and records what happened, and no
stage imports it back (tests/test_imports.py checks).
"""
