"""scoring.remaining_params: the remaining-steps model's parameters, read at import from the package
data file scoring/data/remaining_params.json; its shapes and types, and clear errors for a wrong or
missing file."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scoring import remaining_params
from scoring.remaining import FEATURES, QUANTILES, RemainingModel, Trees
from scoring.remaining_params import RemainingParamsError, load, parse

REPO = Path(__file__).resolve().parents[2]
SHIPPED_TEXT = remaining_params.DATA_FILE.read_text(encoding="utf-8")


def test_the_shipped_models_have_the_shapes_and_types_the_code_uses() -> None:
    shipped = load()
    assert set(shipped.models) == {"OPEN_END", "PLANNED_END"}
    assert shipped.models["OPEN_END"] == remaining_params.OPEN_END
    assert shipped.models["PLANNED_END"] == remaining_params.PLANNED_END
    for model in (remaining_params.OPEN_END, remaining_params.PLANNED_END):
        assert isinstance(model, RemainingModel)
        assert model.quantiles == QUANTILES
        assert type(model.spread) is float and type(model.plateau_threshold) is float
        assert 0.5 <= model.spread <= 4.0 and 0.5 <= model.plateau_threshold < 1.0
        shapes = [(t.depth, len(t.leaf) // 2 ** t.depth) for t in (*model.quantile_trees, model.plateau_trees)]
        assert shapes == [(3, 60), (3, 60), (3, 60), (4, 120)]  # fit_remaining's TREES/DEPTH, PLATEAU_*
        for t in (*model.quantile_trees, model.plateau_trees):
            assert isinstance(t, Trees) and type(t.base) is float and type(t.depth) is int
            assert all(type(v) is int and 0 <= v < FEATURES for v in t.feature)
            assert all(type(v) is float for v in (*t.threshold, *t.leaf))
            assert isinstance(t.feature, tuple) and isinstance(t.threshold, tuple) and isinstance(t.leaf, tuple)


def test_the_note_names_what_the_numbers_were_fit_on() -> None:
    assert "even-numbered OpenML tasks of lcbench/curves.csv" in remaining_params.NOTE
    assert "python -m benchmarks.fit_remaining" in remaining_params.NOTE
    assert "benchmarks/data/lcbench/curves.csv" in (remaining_params.__doc__ or "")


def test_the_data_file_is_package_data() -> None:
    # setuptools copies scoring's package data by these globs into a wheel; a file they miss would
    # exist in a clone and be absent from an installed flowsched (which then fails at import)
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["scoring"]
    covered = {p for g in globs for p in (REPO / "scoring").glob(g) if p.is_file()}
    assert Path(str(remaining_params.DATA_FILE)) in covered
    assert {p for p in (REPO / "scoring" / "data").rglob("*") if p.is_file()} - covered == set()


def test_a_copy_reads_back_equal(tmp_path: Path) -> None:
    copy = tmp_path / "params.json"
    copy.write_text(SHIPPED_TEXT, encoding="utf-8")
    assert load(copy) == load()


def test_a_missing_file_says_what_it_is_and_how_to_make_it(tmp_path: Path) -> None:
    missing = tmp_path / "remaining_params.json"
    with pytest.raises(RemainingParamsError, match=r"remaining_params\.json: missing.*package-data.*fit_remaining"):
        load(missing)


def test_a_file_that_is_not_json_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "remaining_params.json"
    broken.write_text(SHIPPED_TEXT[: len(SHIPPED_TEXT) // 2], encoding="utf-8")  # cut short
    with pytest.raises(RemainingParamsError, match=rf"{broken}: not JSON .*regenerate it with"):
        load(broken)


def _edited(edit: Callable[[dict[str, Any]], object]) -> str:
    doc = json.loads(SHIPPED_TEXT)
    edit(doc)
    return json.dumps(doc)


def _tree(doc: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = doc["models"]["OPEN_END"]["quantile_trees"][0]
    return tree


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(format="flowsched.remaining_params/0"),
     r"x\.json: format 'flowsched.remaining_params/0', this flowsched reads 'flowsched.remaining_params/1'"),
    (lambda d: d["models"].pop("PLANNED_END"), r"x\.json\.models: missing PLANNED_END"),
    (lambda d: d.pop("note"), r"x\.json: missing note"),
    (lambda d: _tree(d).pop("leaf"), r"models\.OPEN_END\.quantile_trees\[0\]: missing leaf"),
    (lambda d: _tree(d)["leaf"].pop(), r"models\.OPEN_END\.quantile_trees\[0\]: trees shape mismatch"),
    (lambda d: _tree(d)["threshold"].__setitem__(3, "0.5"),
     r"models\.OPEN_END\.quantile_trees\[0\]\.threshold: expected a number, got '0.5'"),
    (lambda d: _tree(d)["feature"].__setitem__(0, 1.5),
     r"models\.OPEN_END\.quantile_trees\[0\]\.feature: expected an integer, got 1.5"),
    (lambda d: _tree(d)["feature"].__setitem__(0, True), r"feature: expected an integer, got True"),
    (lambda d: _tree(d)["feature"].__setitem__(0, FEATURES), rf"reads feature {FEATURES}, the evidence gives"),
    (lambda d: d["models"]["PLANNED_END"].update(quantiles=[0.25, 0.5, 0.75]),
     r"models\.PLANNED_END: model quantiles \(0.25, 0.5, 0.75\) are not \(0.1, 0.5, 0.9\)"),
    (lambda d: d["models"]["PLANNED_END"].update(spread=None), r"models\.PLANNED_END\.spread: expected a number"),
    (lambda d: d["models"]["OPEN_END"].update(quantile_trees={}), r"quantile_trees: expected a list, got dict"),
])
def test_a_wrong_file_gives_an_error_that_names_the_place(edit: Callable[[dict[str, Any]], object],
                                                          message: str) -> None:
    with pytest.raises(RemainingParamsError, match=message):
        parse(_edited(edit), "x.json")


def test_the_error_is_a_value_error() -> None:
    # callers that already guard a bad configuration with ValueError keep working
    with pytest.raises(ValueError):
        parse("[]", "x.json")
