"""The benchmark script runs end to end and reports every row of the Performance table with numbers.

No timing assertions: the numbers depend on the machine; only their presence and shape are checked.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "run.py"
ROWS = {
    "hook_heavy_step",
    "hook_heavy_session",
    "transformer_step",
    "transformer_session",
    "save_on_cpu_step",
    "save_on_cpu_session",
    "shim_overhead",
    "memory_per_event",
    "save_load",
    "file_size",
    "cli_help",
    "cli_render",
    "cli_diff",
    "cli_exec_help",
    "exec_untraced_steps",
    "exec_untraced_in_process",
    "render_tree",
    "render_svg",
    "shapes_shim",
    "hook_heavy_shapes",
    "transformer_shapes",
    "hook_heavy_peers",
    "transformer_peers",
    "hook_heavy_bytecodes",
    "transformer_bytecodes",
    "empty_session_10",
    "empty_session_1000",
    "hook_heavy_long_window",
    "memory_per_event_long",
}


@pytest.mark.slow  # about 45 s: .ci/run runs it with -m slow, after the README's test command
def test_quick_benchmark_reports_every_row(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["quick"] is True
    for key in ("cpu", "cores", "python", "torch"):
        assert data["machine"][key], key
    rows = {row["id"]: row for row in data["rows"]}
    assert set(rows) == ROWS
    for row_id, row in rows.items():
        assert row["status"] == "ok", f"{row_id}: {row['note']}"
        assert row["values"], row_id
        numbers = [row["min"], row["median"], row["max"], row["target"], *row["values"]]
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers), (row_id, numbers)
        assert row["min"] <= row["median"] <= row["max"], row_id
        assert row["passed"] is (row["median"] <= row["target"]), row_id
        assert row_id in proc.stdout, f"{row_id} missing from the printed table"
    # the measurements measured something: events were recorded and files were written
    assert rows["hook_heavy_step"]["details"]["events_per_step"] > 0
    assert rows["memory_per_event"]["details"]["events"] >= 10_000
    assert rows["file_size"]["median"] > 0
    assert rows["cli_help"]["details"]["imports_torch"] in (True, False)
    calls = rows["exec_untraced_in_process"]["details"]["python_calls_per_step"]
    assert calls["plain"] > 0 and calls["exec_before_window"] >= calls["plain"], calls
