"""macOS Mach-O files (dylibs, bundles, executables; universal binaries slice by slice) read into
the model judging reads (audit/binary/model.py)."""
