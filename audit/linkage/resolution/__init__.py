"""Finding a binary's libraries as its loader would: ld.so over a file system (`ldso.py` over
`fs.py`: this machine's or an image's), the Windows loader and dyld (`native.py`), each building
the same DepNode tree."""
