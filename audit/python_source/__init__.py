"""Python sources: the library loads a module's code spells out (ctypes, cffi, numpy, torch)."""
