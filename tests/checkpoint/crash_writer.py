"""Subprocess used by test_ckpt_crash: writes checkpoints until the test SIGKILLs it.

Usage: python crash_writer.py ROOT START (one|loop) READY_FILE
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    root, start, mode, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
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
