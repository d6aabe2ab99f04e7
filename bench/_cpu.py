"""The processor a benchmark ran on, as its figures must say (ratios move with the CPU)."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """The model name from /proc/cpuinfo, else what :func:`platform.processor` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def has_avx512() -> bool:
    """Whether the CPU has AVX-512 (the ``avx512f`` flag of /proc/cpuinfo): kernels and ratios differ with it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512f" in line.split()
    except OSError:
        pass
    return False


def run_env() -> dict[str, object]:
    """What a bench's JSON says of the machine and the moment: CPU, cores, AVX-512, load average (at the call:
    call it at the start and keep the end's too), Python and onnxruntime versions."""
    import os
    import sys

    try:
        import onnxruntime

        ort = onnxruntime.__version__
    except ImportError:  # pragma: no cover - every bench needs it, but the JSON should still be written
        ort = None
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "avx512": has_avx512(),
            "loadavg_start": list(os.getloadavg()), "python": sys.version.split()[0], "onnxruntime": ort}
