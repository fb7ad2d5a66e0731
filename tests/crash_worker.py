"""A worker that fails on purpose, for tests/test_launchers.py: ``abort-once`` aborts rank 0
the first time (it leaves MARKER behind), ``abort`` every time, ``raise`` raises an exception.
Usage: torchrun ... crash_worker.py MODE MARKER   (or under horovodrun)"""

import os
import sys
from pathlib import Path

mode, marker = sys.argv[1], Path(sys.argv[2])
rank = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))
if rank == 0 and mode == "raise":
    raise RuntimeError("a bug in the worker")
if rank == 0 and (mode == "abort" or (mode == "abort-once" and not marker.exists())):
    marker.touch()
    os.abort()
