"""Deny-list policies (TOML), installed with the package."""
