"""Windows PE/COFF files (DLL, EXE, .pyd) read into the model judging reads (audit/pe/model.py)."""
