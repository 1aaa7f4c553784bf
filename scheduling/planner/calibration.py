"""Calibration of predicted times against what the running job measured.

The analytic model is only a prior (design digest 5.6: uncalibrated coefficients made
the reference's 14B training step 0.2 s). A ``RatioCalibrator`` keeps an EMA of
measured / predicted and scales later predictions by it; a jump past
``change_ratio`` in either direction switches to the fast ``alpha_change`` for one
update (a change point: new layout, new length regime).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibratorConfig:
    """EMA knobs (reference shadow calibrator: alpha 0.1, 0.8 after a change point)."""

    alpha: float = 0.1
    alpha_change: float = 0.8
    change_ratio: float = 1.5
    """A sample whose ratio differs from the EMA by this factor is a change point."""
    min_factor: float = 0.05
    max_factor: float = 20.0

    def __post_init__(self) -> None:
        if not (0 < self.alpha <= 1 and 0 < self.alpha_change <= 1):
            raise ValueError(
                f"alpha/alpha_change must be in (0, 1], got {self.alpha}/{self.alpha_change}"
            )
        if self.change_ratio <= 1:
            raise ValueError(f"change_ratio must be > 1, got {self.change_ratio}")


class RatioCalibrator:
    """EMA of measured / predicted, applied as a multiplicative correction."""

    def __init__(self, config: CalibratorConfig | None = None) -> None:
        self._config = config or CalibratorConfig()
        self._factor = 1.0
        self.num_samples = 0

    @property
    def factor(self) -> float:
        """Current correction (1.0 before any sample)."""
        return self._factor

    def observe(self, predicted_s: float, measured_s: float) -> None:
        """Fold one (prediction, measurement) pair in; ignore non-positive or infinite ones."""
        if (
            not (predicted_s > 0 and measured_s > 0)
            or math.isinf(predicted_s)
            or math.isinf(measured_s)
        ):
            return
        cfg = self._config
        ratio = min(cfg.max_factor, max(cfg.min_factor, measured_s / predicted_s))
        if self.num_samples == 0:
            self._factor = ratio
        else:
            jump = max(ratio / self._factor, self._factor / ratio)
            alpha = cfg.alpha_change if jump >= cfg.change_ratio else cfg.alpha
            self._factor = (1 - alpha) * self._factor + alpha * ratio
        self.num_samples += 1

    def apply(self, predicted_s: float) -> float:
        """Calibrated prediction."""
        return predicted_s * self._factor
