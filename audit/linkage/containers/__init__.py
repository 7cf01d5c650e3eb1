"""Where the files to audit come from: folders, wheels, conda packages, container images and static
archives, each expanded into the binaries it holds (`inputs.Inputs`), read in place or unpacked within
the archive limits, never outside the input."""
