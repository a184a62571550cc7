"""The HTML report at scale: file size, Python render time and load time in headless Chromium.

    python benchmarks/html_report.py                 # 1,000 / 100,000 / 1,000,000 events
    python benchmarks/html_report.py --sizes 1000    # one size

For each size: the synthetic trace of `run.py` (300 transformer-like module paths, enter, four
hooks, exit per call), rendered with `render(trace, "html")`; then the page is opened in headless
Chromium (tests/browser.py: Debian's chromium and chromium-driver, selenium) and timed until the
viewer is built (`ready`: navigation start to the end of building the page, of which `parse` is
`JSON.parse` of the embedded data and `build` the viewer's indexing and first drawing), then
"expand all" (every row of the tree), a scroll to the bottom and a search are timed in the page.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from run import synthetic_trace  # noqa: E402

from hooktrace.render import render  # noqa: E402
from tests import browser  # noqa: E402

ACTIONS = """
const app = window.hooktraceReport, pane = app.panes[0], t = pane.tree;
let a = performance.now();
document.querySelector("button[title^='Expand every row']").click();
const expand = performance.now() - a;
a = performance.now(); t.scrollTop = t.scrollHeight; pane.draw(); const scroll = performance.now() - a;
a = performance.now(); app.filter.text = "layers.20.linear2"; app.applyFilter(); const search = performance.now() - a;
return [expand, scroll, search, pane.m.nrows, app.count.textContent];
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000, 100_000, 1_000_000])
    args = parser.parse_args()
    reason = browser.missing()
    if reason:
        sys.exit(f"cannot run: {reason}")
    driver_gen = browser.chromium()
    driver = next(driver_gen)
    driver.set_script_timeout(600)
    print(
        "| events | file | render (Python) | ready in Chromium | of which parse / build | expand all | scroll | search |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            trace = synthetic_trace(n)
            t = time.perf_counter()
            page = render(trace, "html")
            rendered = time.perf_counter() - t
            path = Path(tmp) / f"report{n}.html"
            path.write_text(page, encoding="utf-8")
            size = path.stat().st_size
            del page, trace
            t = time.perf_counter()
            logs = browser.open_page(driver, path)
            wall = time.perf_counter() - t
            timings = driver.execute_script("return window.hooktraceTimings")
            expand, scroll, search, rows, count = driver.execute_script(ACTIONS)
            errors = [x for x in logs if x.get("level") == "SEVERE"]
            print(
                f"| {n:,} | {size / 1e6:.1f} MB ({size / n:.0f} B/event) | {rendered:.2f} s | "
                f"{timings['ready_ms'] / 1000:.2f} s (wall {wall:.2f} s) | "
                f"{timings['parse_ms'] / 1000:.2f} / {timings['build_ms'] / 1000:.2f} s | "
                f"{expand:.0f} ms ({rows:,} rows) | {scroll:.0f} ms | {search:.0f} ms ({count}) |"
                + (f" errors: {errors}" if errors else ""),
                flush=True,
            )
    driver_gen.close()


if __name__ == "__main__":
    main()
