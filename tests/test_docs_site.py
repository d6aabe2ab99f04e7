"""The documentation site as a reader sees it: every public name has its API entry, `mkdocs build --strict`
passes (no broken link, anchor or reference), and headless Chromium opens the home page, a tutorial and an API
page from a local HTTP server with no console error and every image decoded; screenshots go to
build/screenshots/. The pages' code blocks are run by conftest.py (Sybil)."""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import streamfit

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHOTS = ROOT / "build" / "screenshots"
PAGES = {"home": "index.html", "tutorial": "tutorials/kafka-clicks/index.html",
         "api": "reference/estimators/index.html"}
# a probe appended to a copy of each page: once loaded, it writes what decoded and what the console said
PROBE = """<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push('error: ' + (e.message || (e.target && e.target.src))), true);
window.addEventListener('unhandledrejection', e => window.__errors.push('rejection: ' + e.reason));
const origError = console.error;
console.error = (...a) => { window.__errors.push('console.error: ' + a.join(' ')); origError(...a); };
window.addEventListener('load', () => setTimeout(() => {
  document.body.setAttribute('data-images', Array.from(document.images).map(
    i => (i.getAttribute('src') || '') + '=' + (i.complete && i.naturalWidth > 0 ? i.naturalWidth : 0)).join('|'));
  document.body.setAttribute('data-errors', window.__errors.join('|'));
  document.body.setAttribute('data-probed', '1');
}, 500));
</script>"""


def test_every_public_name_has_an_api_entry():
    documented = set()
    for page in (DOCS / "reference").glob("*.md"):
        documented |= set(re.findall(r"^::: streamfit\.(\w+)\s*$", page.read_text(), re.M))
    public = {name for name in streamfit.__all__ if name != "__version__"}
    assert public - documented == set(), f"public names without an API entry in docs/reference/: {public - documented}"
    assert documented - public == set(), f"API entries of names that are not public: {documented - public}"


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if not p.name.startswith("_")
             and "data" not in p.parts}
    missing = {p for p in pages if not re.search(rf"(^|\s){re.escape(p)}\s*$", nav, re.M)}
    assert not missing, f"pages not in mkdocs.yml's nav: {sorted(missing)}"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs site needs the [docs] extra (mkdocs-material, mkdocstrings)")
    pytest.importorskip("material", reason="the docs site needs the [docs] extra (mkdocs-material)")
    pytest.importorskip("mkdocstrings", reason="the docs site needs the [docs] extra (mkdocstrings[python])")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                              "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stderr[-4000:]}"
    return out


def test_site_builds_strict_with_every_public_name(site):
    api = (site / "reference" / "estimators" / "index.html").read_text()
    assert 'id="streamfit.OnnxRegressor"' in api and "partial_fit" in api
    for page in PAGES.values():
        assert (site / page).exists(), page
    assert (site / "report-demo.png").exists() and (site / "benchmarks" / "engine.png").exists()


def test_pages_open_in_chromium_with_no_console_error_and_every_image(site, tmp_path):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no Chromium found (Debian: apt-get install chromium; .ci/run installs it as root): "
                    "the site was not opened in a browser")
    for name, page in PAGES.items():  # probe copies beside the pages, so relative links resolve the same
        html = (site / page).read_text()
        (site / page).with_name("probe.html").write_text(html.replace("</body>", PROBE + "</body>"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a, **k: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--enable-logging=stderr", "--v=0",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1600", "--virtual-time-budget=8000"]
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        for name, page in PAGES.items():
            probe = page.rsplit("/", 1)[0] + "/probe.html" if "/" in page else "probe.html"
            dom = subprocess.run([chromium, *flags, "--dump-dom", base + probe], capture_output=True, text=True,
                                 timeout=180)
            assert dom.returncode == 0, dom.stderr[-2000:]
            assert 'data-probed="1"' in dom.stdout, f"{name}: the probe did not run\n{dom.stderr[-2000:]}"
            errors = re.search(r'data-errors="([^"]*)"', dom.stdout).group(1)
            assert errors == "", f"{name}: {errors}"
            images = [i.rsplit("=", 1) for i in re.search(r'data-images="([^"]*)"', dom.stdout).group(1).split("|") if i]
            broken = [src for src, width in images if int(width) == 0]
            assert not broken, f"{name}: images that did not load: {broken}"
            if name == "home":
                assert any("report-demo.png" in src for src, _ in images), images
            shot = SHOTS / f"{name}.png"
            run = subprocess.run([chromium, *flags, f"--screenshot={shot}", base + page], capture_output=True,
                                 text=True, timeout=180)
            assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
            console = [line for line in (run.stderr + dom.stderr).splitlines()
                       if "CONSOLE" in line or ":ERROR:" in line and ("Uncaught" in line or "Failed to load" in line
                                                                     or "net::" in line)]
            assert not console, f"{name}: {console}"
            import matplotlib.image

            pixels = matplotlib.image.imread(shot)
            assert pixels.shape[0] >= 1000 and pixels[..., :3].std() > 0.05, f"{name}: a blank screenshot"
    finally:
        server.shutdown()
        server.server_close()


def test_readme_is_short_starts_with_the_two_setup_commands_and_links_existing_pages():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160, "the README is the newcomer's page: details go into docs/"
    blocks = re.findall(r"```(\w*)\n(.*?)```", readme, re.S)
    assert blocks[0] == ("bash", "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
                                 "streamfit train --demo\n")
    assert blocks[1] == ("bash", 'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" && '
                                 "python -m pytest -q\n")
    links = re.findall(r"\]\(((?!https?:)[^)#]+)(?:#[^)]*)?\)", readme)
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
