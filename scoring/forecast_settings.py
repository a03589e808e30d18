"""How the end forecast under a stopping rule is drawn and read (scoring.job_end, scoring.end_paths).

Its own module so that scoring.end_paths, which draws the sampled futures, and scoring.job_end,
which reads them, both take it from below (they imported each other before 2026-11-29).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scoring.end_interval import EndIntervalSettings


@dataclass(frozen=True)
class ForecastSettings:
    samples: int = 128  # sampled future curves (a job with early stopping costs ~20-40 ms per estimate)
    improvement_sd: float = 0.5  # log-normal spread of each sample's future improvement
    # early stopping: this share of the sampled futures improve no more from now on. The curve families all
    # keep decreasing, but a validation series stops at its best once the model overfits or has learnt what it
    # can: asked at 75 % of their time, about half of the long real runs (benchmarks/data/real_curves_long)
    # ended within 15 % of "no improvement from now". 0.2: the lowest median error on the 43 early-stopping
    # tuning runs among 0 / 0.1 / 0.2 / 0.3 (docs/progress-api.md)
    stall_share: float = 0.2
    # early stopping: the families are fitted to the last this share of the monitored series' span (at least
    # min_fit_points evaluations), as the plateau reads the recent half with no rule. Fitted to the whole
    # series, the first evaluations' drop set the families' shape and they promised improvement a flattening
    # series no longer showed. 0.9: the lowest mean of the median errors on the project's tuning runs, their
    # replayed prefixes and the Pollux artifact's validation traces (the simulator's curves) among 0.6 / 0.75 /
    # 0.9 / 1; 0.6 read best on the tuning runs but worse on the traces, whose step decays it extrapolates
    # (docs/progress-api.md)
    stopping_recent_share: float = 0.9
    max_evaluations: int = 2000  # future evaluations simulated; later ends count as beyond the horizon
    # future evaluations drawn at a time: a forecast stops drawing once the samples its point and interval
    # read have ended (scoring.end_paths). Most early-stopping forecasts end within the first hundred
    # evaluations; max_evaluations draws the whole horizon at once, as before 2026-11-29 (the same samples)
    block_evaluations: int = 64
    target_evaluations: int = 400  # a target alone is checked at this many future points at most
    noise_points: int = 20  # recent points whose residuals around the fit give the noise
    rate_slack: float = 0.02  # the step rate's interval: the extreme window rates, widened by this
    rate_windows: int = 4  # the current run's time cut in this many spans, each giving a rate
    recent_share: float = 0.5  # no rule: the learnt model reads the last this share of the span
    quantise: bool = True  # a series on a grid (accuracy k/N) is forecast on that grid
    prior_share: float = 1.0  # too few evaluations to fit: the point is this share of the steps run so far
    prior_high: float = 9.0  # ... and the interval's high end this multiple (the prior's 90th percentile)
    seed: int = 0
    intervals: EndIntervalSettings = field(default_factory=EndIntervalSettings)  # per rule (scoring.end_interval)

    def __post_init__(self) -> None:
        if self.samples < 10 or self.max_evaluations < 1 or self.noise_points < 2 or self.block_evaluations < 1:
            raise ValueError("forecast needs samples >= 10, max_evaluations >= 1, noise_points >= 2, "
                             "block_evaluations >= 1")
        if not (0 < self.recent_share <= 1 and self.rate_slack >= 0 and self.improvement_sd >= 0):
            raise ValueError("recent_share in (0, 1], rate_slack and improvement_sd >= 0")
        if not 0 <= self.stall_share < 1:
            raise ValueError("stall_share in [0, 1)")
        if not 0 < self.stopping_recent_share <= 1:
            raise ValueError("stopping_recent_share in (0, 1]")
