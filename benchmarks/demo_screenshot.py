"""Take the README's screenshot of ``csdgen demo`` (docs/demo.png) on the shipped built-in model.

Starts ``csdgen demo`` on a free loopback port, asks for one class with AR and CSD at a fixed
window and seed in headless Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright, as
tests/test_demo.py does), waits until both methods' images and maps are shown and saves the page.
The PNG is written with an adaptive palette so it stays small.

    OMP_NUM_THREADS=1 python benchmarks/demo_screenshot.py --out docs/demo.png

Options: ``--class`` (default "red apple"), ``--window`` (16), ``--seed`` (0), ``--width`` of
the browser viewport in pixels (1280), ``--colours`` of the saved palette (256).
Needs the test extra (playwright) and Debian's chromium; raises SystemExit naming what is missing.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/demo.png"))
    parser.add_argument("--class", dest="condition", default="red apple")
    parser.add_argument("--window", default="16")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--colours", type=int, default=256)
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from PIL import Image
    from playwright.sync_api import expect, sync_playwright

    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "csdgen", "demo", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("csdgen demo did not start")
                time.sleep(0.5)
        raw = args.out.with_suffix(".raw.png")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": args.width, "height": 900})
                page.goto(url, wait_until="domcontentloaded")
                page.locator("#condition").locator("input, textarea").first.fill(args.condition)
                page.locator("#window").locator("input, textarea").first.fill(args.window)
                page.locator("#seed").locator("input, textarea").first.fill(args.seed)
                page.locator("#run").click()
                expect(page.locator("#stats table")).to_be_visible(timeout=300_000)
                shown = ", ".join(f"#{kind}-{m} img" for m in ("ar", "csd") for kind in ("image", "acceptance", "entropy"))
                page.wait_for_function(f"""() => {{ const imgs = [...document.querySelectorAll({shown!r})];
                    return imgs.length === 6 && imgs.every(i => i.complete && i.naturalWidth > 0); }}""", timeout=30_000)
                page.screenshot(path=str(raw), full_page=True)
            finally:
                browser.close()
        image = Image.open(raw).convert("RGB").quantize(colors=args.colours, method=Image.Quantize.MEDIANCUT)
        image.save(args.out, optimize=True)
        raw.unlink()
        print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KB, {image.width} x {image.height})")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
