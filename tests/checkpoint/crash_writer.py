"""Subprocess used by test_crash.py: writes checkpoints until the test SIGKILLs it.

Usage: python crash_writer.py ROOT START (one|loop) READY_FILE
"""

from __future__ import annotations

import sys
import types
from pathlib import Path


def main() -> None:
    root, start, mode, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    repo = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(repo))
    # The checkpoint package does not depend on the engine: skip streamfit/__init__.py (which
    # imports onnxruntime, ~1 s per process) so the many writer processes start fast.
    stub = types.ModuleType("streamfit")
    stub.__path__ = [str(repo / "streamfit")]
    sys.modules["streamfit"] = stub
    from tests.checkpoint.helpers import content

    from streamfit.checkpoint import CheckpointStore

    store = CheckpointStore(root, keep=2)
    ready.write_text("ready")
    step = start
    while True:
        store.save(step, *content(step))
        if mode == "one":
            return
        step += 1


if __name__ == "__main__":
    main()
