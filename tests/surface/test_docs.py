"""The documentation site: it builds with `mkdocs build --strict`, every page loads in a real
headless Chromium (Debian's) with no console error and a title, every internal link and anchor
resolves, and the pages that carry checked content say what the code does.

The site is served on a loopback port by a server this test starts; the browser may ask for
nothing else (every other request is refused and fails the test), so a page that loads a web
font or a script from outside shows up here.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar
from urllib.parse import urldefrag, urljoin, urlsplit

import pytest

from gpu_queue_scaler.settings.reference import BEGIN, END, markdown
from tests.tools import require

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The flags the browser runs with on this machine: no sandbox (root in a container), no GPU, and
# none of Chromium's own traffic (updates, sync, field trials) off the loopback.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Every page the nav lists, and so every page a reader reaches from the home page.
PAGES = [
    "index.md",
    "trigger.md",
    "signals.md",
    "tuning.md",
    "operations.md",
    "companion.md",
    "observability.md",
    "architecture.md",
    "bench.md",
    "compatibility.md",
]


class _Links(HTMLParser):
    """The URLs a page refers to (a, link, script, img, source) and the ids it holds. A URL
    is `loaded` when the browser fetches it by itself (all but an `a` a reader may follow)."""

    ATTRS: ClassVar[dict[str, str]] = {
        "a": "href",
        "link": "href",
        "script": "src",
        "img": "src",
        "source": "src",
    }

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, bool]] = []  # (url, loaded)
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        url = values.get(self.ATTRS.get(tag, ""))
        if url:
            self.urls.append((url, tag != "a"))


def _parse(html: str) -> _Links:
    parser = _Links()
    parser.feed(html)
    return parser


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `./dev test` builds it: `mkdocs build --strict` (a warning fails it)."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    """The built site, served on a free loopback port for the duration of the module."""

    def handler(*args: object, **kwargs: object) -> _Quiet:
        return _Quiet(*args, directory=str(site), **kwargs)  # type: ignore[arg-type]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def _page_url(base: str, page: str) -> str:
    """A docs page's URL in the built site (directory URLs: trigger.md -> trigger/)."""
    return base if page == "index.md" else urljoin(base, page.removesuffix(".md") + "/")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:  # loopback only
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, b""


def test_every_page_of_the_nav_is_built(site: Path) -> None:
    built = {p.relative_to(site).as_posix() for p in site.rglob("index.html")}
    for page in PAGES:
        want = "index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html"
        assert want in built, f"{page} is not in the built site"
    assert {p.name for p in DOCS.glob("*.md")} == set(PAGES), "a page in docs/ is not in the nav"


def test_every_internal_link_and_anchor_resolves(site: Path, base_url: str) -> None:
    """Crawl every built page: each internal URL it refers to answers 200 from the server, and a
    link's #fragment names an id on the page it points at. Nothing is loaded from outside."""
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    assert len(pages) >= len(PAGES)
    ids: dict[str, set[str]] = {}
    checked: dict[str, int] = {}
    broken: list[str] = []
    outside: list[str] = []
    for path in pages:
        url = urljoin(base_url, path.relative_to(site).as_posix().removesuffix("index.html"))
        links = _parse(path.read_text(encoding="utf-8"))
        for ref, loaded in links.urls:
            target, fragment = urldefrag(urljoin(url, ref))
            parts = urlsplit(target)
            if parts.scheme in ("mailto", "javascript", "data"):
                continue
            if parts.netloc != urlsplit(base_url).netloc:
                if loaded:
                    outside.append(f"{path.relative_to(site)}: {ref}")
                continue
            if target not in checked:
                status, body = _get(target)
                checked[target] = status
                if status == 200 and body.lstrip().lower().startswith(b"<!doctype html"):
                    ids[target] = _parse(body.decode("utf-8")).ids
            if checked[target] != 200:
                broken.append(f"{path.relative_to(site)}: {ref} -> {checked[target]}")
            elif fragment and target in ids and fragment not in ids[target]:
                broken.append(f"{path.relative_to(site)}: {ref} -> no id {fragment!r}")
    assert not broken, "\n".join(broken)
    assert not outside, "pages load resources from outside the site:\n" + "\n".join(outside)
    assert len(checked) > len(PAGES)  # the crawl followed the nav, assets and results


def test_every_page_renders_in_chromium(base_url: str, tmp_path: Path) -> None:
    """Each page opened in Debian's Chromium through the DevTools protocol (playwright, with no
    browser of its own): it loads, has a title and its heading, shows every image, and logs no
    console error and no uncaught exception; every request goes to the site's own server."""
    from playwright.sync_api import sync_playwright

    chromium = require("chromium")
    failures: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a new, empty --user-data-dir
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_FLAGS,
        )
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            origin = urlsplit(base_url).netloc

            def only_the_site(route: object) -> None:
                request = route.request  # type: ignore[attr-defined]
                if urlsplit(request.url).netloc == origin:
                    route.continue_()  # type: ignore[attr-defined]
                else:
                    errors.append(f"request outside the site: {request.url}")
                    route.abort()  # type: ignore[attr-defined]

            page.route("**/*", only_the_site)
            for name in PAGES:
                errors.clear()
                answer = page.goto(_page_url(base_url, name), wait_until="load", timeout=60_000)
                status = answer.status if answer else None
                title = page.title()
                heading = page.locator("article h1").first.inner_text(timeout=30_000)
                # An image the browser could not decode (a plot moved, a wrong path) has no width.
                blank = page.evaluate(
                    "Array.from(document.images)"
                    ".filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
                )
                if status != 200 or not title.strip() or not heading.strip() or errors or blank:
                    failures.append(
                        f"{name}: status {status}, title {title!r}, errors {errors}, "
                        f"images not shown {blank}"
                    )
        finally:
            browser.close()
    assert not failures, "\n".join(failures)


def test_the_trigger_page_holds_the_generated_parameter_reference() -> None:
    """The parameter list is `scaler reference`'s output (from `gpu_queue_scaler.settings.fields`),
    exactly."""
    text = (DOCS / "trigger.md").read_text(encoding="utf-8")
    block = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert block == markdown(), (
        "docs/trigger.md's parameter list is stale: paste the output of `scaler reference`"
    )
