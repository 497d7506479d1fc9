"""95% t-intervals for the handful of samples a benchmark can afford: seeds of a training run, alternating rounds of
a serving load."""

from __future__ import annotations

import math

# t quantiles (0.975) by degrees of freedom, for the 95% intervals of a handful of samples.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def t975(df: float) -> float:
    if df >= 30:
        return 1.96
    lower = max(1, math.floor(df))
    return T975.get(lower, 2.2)  # rounding df down keeps the interval on the wide (honest) side


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    """Mean, sample variance, half-width of the 95% t-interval."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else float("nan")
    return mean, var, t975(n - 1) * math.sqrt(var / n) if n > 1 else float("nan")


def difference_ci(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of a - mean of b, and the half-width of its 95% Welch interval."""
    (ma, va, _), (mb, vb, _) = mean_ci(a), mean_ci(b)
    se2 = va / len(a) + vb / len(b)
    if not se2 > 0:
        return ma - mb, float("nan")
    df = se2 ** 2 / ((va / len(a)) ** 2 / (len(a) - 1) + (vb / len(b)) ** 2 / (len(b) - 1))
    return ma - mb, t975(df) * math.sqrt(se2)
