"""Open a report.html in a real headless browser and check that the screenshot shows figures.

    python -m visualize.check_report RUN_DIR/report.html [--screenshot shot.png]

Needs Chromium (on Debian: ``apt-get install chromium``). The page is loaded from disk with the
network unused (the report embeds everything), captured, and the capture is checked for what
figures leave and a page without them does not: many distinct colours, and a good share of
pixels that are not background white. Exit 0 when it passes, 1 when it does not, 2 when no
browser is found.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
MIN_COLOURS = 500  # text and tables alone have a few dozen (anti-aliased greys)
MIN_INKED = 0.05  # share of pixels that are not near-white


def find_browser() -> str | None:
    return next((path for b in BROWSERS if (path := shutil.which(b))), None)


def screenshot(browser: str, page: Path, out: Path, size=(1200, 2400)) -> None:
    subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", f"--window-size={size[0]},{size[1]}",
                    f"--screenshot={out}", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)


def inspect(image_path: Path) -> dict:
    import matplotlib.image as mpimg

    image = (mpimg.imread(image_path)[:, :, :3] * 255).astype(np.uint8)
    flat = image.reshape(-1, 3)
    colours = len(np.unique(flat.view([("", np.uint8)] * 3)))
    inked = float((flat.min(axis=1) < 235).mean())
    return {"width": image.shape[1], "height": image.shape[0], "colours": colours,
            "inked_share": inked, "shows_figures": colours >= MIN_COLOURS and inked >= MIN_INKED}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--screenshot", type=Path, help="keep the capture here")
    args = parser.parse_args(argv)
    browser = find_browser()
    if browser is None:
        print("no Chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        shot = args.screenshot or Path(tmp) / "report.png"
        screenshot(browser, args.report, shot)
        result = {"browser": browser, "screenshot": str(shot), **inspect(shot)}
    print(json.dumps(result, indent=1))
    return 0 if result["shows_figures"] else 1


if __name__ == "__main__":
    sys.exit(main())
