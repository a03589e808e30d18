"""What every shipped set of real runs is held to: small files, and a SOURCE.md that names what made it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

MAX_BYTES = 2 * 1024 * 1024


def shipped_small_and_sourced(folder: Path, needed: Iterable[str]) -> dict[str, int]:
    """Every CSV in `folder` under MAX_BYTES and its SOURCE.md naming each of `needed`; the CSVs' sizes."""
    sizes = {p.name: p.stat().st_size for p in folder.glob("*.csv")}
    assert all(b < MAX_BYTES for b in sizes.values()), sizes
    source = (folder / "SOURCE.md").read_text()
    for word in needed:
        assert word in source, f"{folder.name}/SOURCE.md lacks {word!r}"
    return sizes
