"""The package layout's size rule (issue 41; docs/architecture.md): no module in
``components/`` or ``pipelines/`` over 600 lines — a file that grows past it is split by
what it owns, not left to grow."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 600


def test_no_module_in_components_or_pipelines_is_over_600_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for top in ("components", "pipelines")
            for p in sorted((ROOT / top).rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > LIMIT}
    assert not long, f"over {LIMIT} lines (split by what each part owns): {long}"
