"""The documentation's code blocks as tests: every Python and bash block of README.md and docs/**/*.md.

Sybil (not pytest-markdown-docs or mktestdocs) because the pages read as one story: a page's blocks share one
namespace, in order, as a reader runs them; a block that cannot run here is skipped by a comment the reader does
not see (``<!-- skip: next "why" -->``, the reason shown in pytest's summary) and set-up a reader need not see goes
in an ``<!-- invisible-code-block: python -->``; each block is its own pytest item (``docs/x.md::line:12``), and a
custom parser runs bash blocks. Each page runs in a fresh temporary working directory, so files it writes
(``model.onnx``, ``data/``, ``ckpt/``) are the page's own; the repository's ``tests/``, ``bench/`` and
``examples/`` are linked into it, since a reader runs the pages from the repository's root. Docstring examples run by ``--doctest-modules``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
collect_ignore = ["docs/_griffe_roles.py", "build"]  # griffe is the [docs] extra's, not a test

try:
    from sybil import Sybil
    from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser
    from sybil.parsers.markdown.codeblock import CodeBlockParser
except ImportError:  # pragma: no cover - the [test] extra has sybil
    Sybil = None

BASH_TIMEOUT = 300  # a command-line call is ~3 s here, ~20 s on 2 cores at a load of 12


_CACHE: list[str] = []


def _preflight_cache() -> str:
    """One preflight cache for every page of the session (a model checked on one page is not checked again)."""
    if not _CACHE:
        import atexit
        import shutil

        _CACHE.append(tempfile.mkdtemp(prefix="streamfit-docs-preflight-"))
        atexit.register(shutil.rmtree, _CACHE[0], True)
    return _CACHE[0]


def _setup(namespace: dict[str, Any]) -> None:
    work = tempfile.mkdtemp(prefix="streamfit-docs-")
    namespace["__docs_dir__"], namespace["__docs_cwd_before__"] = work, os.getcwd()
    namespace["__docs_env_before__"] = {k: os.environ.get(k) for k in ("STREAMFIT_CACHE_DIR", "MPLBACKEND")}
    os.environ["STREAMFIT_CACHE_DIR"] = _preflight_cache()  # not the user's; shared by the pages
    os.environ["MPLBACKEND"] = "Agg"
    for name in ("tests", "bench", "examples"):
        os.symlink(ROOT / name, os.path.join(work, name))
    os.chdir(work)


def _teardown(namespace: dict[str, Any]) -> None:
    import shutil

    os.chdir(namespace["__docs_cwd_before__"])
    for key, value in namespace["__docs_env_before__"].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    shutil.rmtree(namespace["__docs_dir__"], ignore_errors=True)


def run_bash(example: Any) -> None:
    """Run a bash block in the page's directory with this interpreter's scripts first on PATH (``streamfit``)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", example.parsed], cwd=example.namespace["__docs_dir__"],
                         env=env, capture_output=True, text=True, timeout=BASH_TIMEOUT)
    if run.returncode != 0:
        raise AssertionError(f"bash block exited {run.returncode}\n--- stdout\n{run.stdout[-3000:]}\n"
                             f"--- stderr\n{run.stderr[-3000:]}")


if Sybil is not None:
    pytest_collect_file = Sybil(
        parsers=[PythonCodeBlockParser(), CodeBlockParser(language="bash", evaluator=run_bash), SkipParser()],
        patterns=["README.md", "docs/*.md", "docs/*/*.md"],
        setup=_setup, teardown=_teardown,
    ).pytest()


if Sybil is not None:
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item: Any, call: Any) -> Any:
        """A skipped block is reported at its page and line (``docs/x.md:12: reason``), not inside unittest."""
        outcome = yield
        report = outcome.get_result()
        example = getattr(item, "example", None)
        if example is not None and report.skipped and isinstance(report.longrepr, tuple):
            path = Path(example.path)
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            report.longrepr = (str(where), example.line, report.longrepr[2])
