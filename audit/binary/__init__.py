"""What the non-ELF format readers share: one binary model (model.py) and the helpers that map a
file and search its data (common.py). The ELF reader fills its own ElfInfo with the same field names."""
