"""scoring.log_progress on output captured from the libraries themselves (tests/data/logs/README.md)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from scoring.log_progress import LogProgressParser, LossRegexError, ParsedPoint, compile_loss_regex

LOGS = Path(__file__).parents[1] / "data" / "logs"


def parse_file(name: str, parser: LogProgressParser | None = None) -> list[ParsedPoint]:
    p = parser or LogProgressParser()
    text = (LOGS / name).read_text(encoding="utf-8")
    return [pt for line in text.split("\n") for pt in p.feed(line)] + p.flush()


def fixture(prefix: str, suffix: str = "") -> str:
    found = sorted(f.name for f in LOGS.glob(f"{prefix}*{suffix}.log"))
    assert len(found) == 1, f"expected one captured log {prefix}*{suffix}.log in {LOGS}, found {found}"
    return found[0]


def assert_curve(points: list[ParsedPoint], pattern: str) -> None:
    assert points, "nothing parsed"
    assert {p.pattern for p in points} == {pattern}
    steps = [p.step for p in points]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), steps
    assert all(math.isfinite(p.loss) and p.loss > 0 for p in points)
    assert points[-1].loss < points[0].loss  # each captured run trains a learnable toy task


def test_keras_progress_bar_with_ansi_and_backspaces() -> None:
    points = parse_file(fixture("keras-", "verbose1"))
    assert_curve(points, "keras")
    # 16 batches per epoch, 5 epochs: the bar's first redraw and the epoch's last line.
    assert [p.step for p in points] == [1, 16, 17, 32, 33, 48, 49, 64, 65, 80]
    assert points[1].loss == pytest.approx(0.6682)


def test_keras_verbose2_one_line_per_epoch() -> None:
    points = parse_file(fixture("keras-", "verbose2"))
    assert_curve(points, "keras")
    assert [p.step for p in points] == [16, 32, 48, 64, 80]
    assert [p.loss for p in points] == [0.7192, 0.5196, 0.4185, 0.3463, 0.2909]


def test_lightning_tqdm_bar_one_point_per_step_with_its_own_loss() -> None:
    points = parse_file(fixture("lightning-", "tqdm"))
    assert_curve(points, "lightning")
    assert [p.step for p in points] == list(range(1, 31))  # 3 epochs of 10 batches, batch-0 resets skipped
    # The bar shows "2/10 …, train_loss=0.693" (step 1's loss) before "2/10 …, train_loss=0.699".
    assert [p.loss for p in points[:3]] == [0.693, 0.699, 0.722]
    assert points[-1].loss == 0.603


def test_lightning_rich_bar_off_a_terminal_is_one_final_point() -> None:
    points = parse_file(fixture("lightning-", "rich"))
    assert points == [ParsedPoint(30, 0.603, "lightning")]


def test_huggingface_trainer_dicts_take_the_bar_step() -> None:
    points = parse_file(fixture("transformers-"))
    assert_curve(points, "huggingface")
    # logging_steps=5 over 30 steps: the bar's counter at each log line is a multiple of 5.
    assert [p.step for p in points] == [5, 10, 15, 20, 25, 30]


def test_plain_step_loss_lines() -> None:
    points = parse_file(fixture("plain-"))
    assert_curve(points, "plain")
    assert [p.step for p in points] == list(range(10, 201, 10))


@pytest.mark.parametrize("line, step, loss", [
    ("step=5 loss=0.5", 5, 0.5),
    ("INFO global_step: 1200, train_loss: 1.5e-1", 1200, 0.15),
    ("iter 7 ... Iteration=7 loss = 2", 7, 2.0),
])
def test_plain_variants(line: str, step: int, loss: float) -> None:
    assert LogProgressParser().feed(line) == [ParsedPoint(step, loss, "plain")]


def test_nan_loss_and_noise_lines_yield_nothing() -> None:
    p = LogProgressParser()
    assert p.feed("step=5 loss=nan") == []
    assert p.feed("downloading shards 3/10") == []
    assert p.feed("") == []
    assert p.feed("x" * 100_000 + " step=5 loss=0.1") == []  # cut at MAX_LINE_CHARS before matching


def test_repeated_step_from_a_redraw_is_one_point_and_restart_goes_back() -> None:
    p = LogProgressParser()
    assert len(p.feed("step=10 loss=0.9\rstep=10 loss=0.9")) == 1
    assert p.feed("step=4 loss=1.0") == [ParsedPoint(4, 1.0, "plain")]  # back: a restart, kept


def test_custom_regex_with_and_without_step() -> None:
    p = LogProgressParser(compile_loss_regex(r"it (?P<step>\d+): objective (?P<loss>[\d.]+)"))
    assert p.feed("it 3: objective 0.25") == [ParsedPoint(3, 0.25, "custom")]
    assert p.feed("step=9 loss=0.1") == []  # a custom regex replaces the built-in formats
    q = LogProgressParser(compile_loss_regex(r"obj=(?P<loss>[\d.]+)"))
    assert [pt.step for line in ("obj=0.5", "x", "obj=0.4") for pt in q.feed(line)] == [1, 2]


@pytest.mark.parametrize("bad, why", [("(unclosed", "does not compile"), (r"loss=(\d+)", "named group")])
def test_bad_custom_regex_is_a_clear_error(bad: str, why: str) -> None:
    with pytest.raises(LossRegexError, match=why):
        compile_loss_regex(bad)
