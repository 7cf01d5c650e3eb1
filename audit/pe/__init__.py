"""Windows PE/COFF files (DLL, EXE, .pyd) read into the model judging reads (audit/binary/model.py)."""
