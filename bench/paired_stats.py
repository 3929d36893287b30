"""Paired estimates for the benchmarks that compare two arms side by side (tracing_cost.sh,
agent_ab.sh): a mean with its 95 % confidence interval, and one arm's cost over the other's."""
import statistics

T95 = [0, 12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14]


def mean_ci(xs):
    """Mean and half-width of its 95 % confidence interval (Student's t)."""
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, float("nan")
    df = len(xs) - 1
    t = T95[df] if df < len(T95) else 1.96 + 2.4 / df  # within 0.01 of Student's t past 14
    return m, t * statistics.stdev(xs) / len(xs) ** 0.5


def paired(on, off):
    """Cost of `on` over `off` from paired samples: the mean paired difference over the mean of
    `off`, and its 95 % confidence interval. Not the mean of the per-pair ratios: a ratio's noisy
    denominator (E[1/x] > 1/E[x]) biases it upwards by about the squared relative noise of one
    sample even when the two do not differ -- +1 % at (2,2,2)'s 4-step blocks, twice the target
    (tracing_cost.sh's A/A control shows it)."""
    m, h = mean_ci([a - b for a, b in zip(on, off)])
    base = statistics.mean(off)
    return 1 + m / base, h / base
