"""numpy imported with its BLAS on one thread, for commands that only read binaries.

numpy's wheels link OpenBLAS, which starts a pool of worker threads when numpy is imported;
they spin on every other core for a while (about 80 ms of CPU on two cores) although reading
an ELF file never multiplies a matrix. The thread count is read from the environment once, when
the library loads, so it is set for the import and put back right after: nothing this process
starts later inherits it.
"""

from __future__ import annotations

import os
import sys

_VAR = "OPENBLAS_NUM_THREADS"


def import_numpy() -> None:
    """Import numpy now, its BLAS on one thread (no effect if numpy is imported already)."""
    if "numpy" in sys.modules:
        return
    before = os.environ.get(_VAR)
    os.environ[_VAR] = "1"
    try:
        import numpy  # noqa: F401
    except ImportError:  # reported where it is first needed, as before
        pass
    finally:
        if before is None:
            os.environ.pop(_VAR, None)
        else:
            os.environ[_VAR] = before
