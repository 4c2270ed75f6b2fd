"""Chi-square tests without scipy: the survival function of the chi-square distribution (the
regularized upper incomplete gamma function, Numerical Recipes' series and continued fraction),
goodness of fit against expected counts and homogeneity of two samples, with cells whose expected
count is under 5 pooled into one."""

from __future__ import annotations

import math
from collections import Counter


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X chi-square with dof degrees of freedom."""
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    gln = math.lgamma(a)
    if z < a + 1.0:  # series for the lower function P(a, z)
        term = total = 1.0 / a
        ap = a
        for _ in range(10000):
            ap += 1.0
            term *= z / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - gln))
    # Continued fraction for Q(a, z) (modified Lentz).
    tiny = 1e-300
    b = z + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(-z + a * math.log(z) - gln) * h


def goodness_of_fit(samples: list, probs: dict) -> tuple[float, int]:
    """(p-value, dof) of the samples against the exact probabilities {outcome: p} (outcomes missing
    from probs have p = 0: one observed is a failure, p-value 0)."""
    n = len(samples)
    seen = Counter(samples)
    if any(probs.get(o, 0.0) <= 0.0 for o in seen):
        return 0.0, 0
    big = {o for o, p in probs.items() if p * n >= 5}
    stat, cells = 0.0, 0
    for o in big:
        e = probs[o] * n
        stat += (seen.get(o, 0) - e) ** 2 / e
        cells += 1
    rest_e = n - sum(probs[o] * n for o in big)
    rest_o = n - sum(seen.get(o, 0) for o in big)
    if rest_e >= 1.0:
        stat += (rest_o - rest_e) ** 2 / rest_e
        cells += 1
    return chi2_sf(stat, cells - 1), cells - 1


def homogeneity(a: list, b: list) -> tuple[float, int]:
    """(p-value, dof) of the hypothesis that two samples come from one distribution."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    pooled = {o: (ca.get(o, 0) + cb.get(o, 0)) / (na + nb) for o in set(ca) | set(cb)}
    big = {o for o, p in pooled.items() if p * min(na, nb) >= 5}
    rows = [(ca.get(o, 0), cb.get(o, 0)) for o in big]
    rows.append((na - sum(r[0] for r in rows), nb - sum(r[1] for r in rows)))
    rows = [r for r in rows if r[0] + r[1] > 0]
    stat = 0.0
    for oa, ob in rows:
        p = (oa + ob) / (na + nb)
        stat += (oa - p * na) ** 2 / (p * na) + (ob - p * nb) ** 2 / (p * nb)
    return chi2_sf(stat, len(rows) - 1), len(rows) - 1
