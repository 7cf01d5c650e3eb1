"""Ed25519 keys and DSSE envelopes: shared by `check --attest` (judging) and the signed bundle (report)."""
