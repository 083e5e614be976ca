"""Monotone piecewise-linear vector functions: the calculus of vector HDRF.

YTsaurus's ``library/vector_hdrf`` describes every element of a pool tree by monotone
piecewise-linear functions (fair share by fit factor, max fit factor by suggestion, fair share
by suggestion) and combines them by summing, shifting, inverting and composing. This module is
that toolbox. It is written once over a number type: ``fractions.Fraction`` (exact, the
default for small trees) or ``float`` (the fast backend for large trees; see ``docs/trees.md``,
"Speed"). A function never mixes the two.

Conventions, the same as YTsaurus's:

* A function is a list of points ``(x, y)`` with non-decreasing ``x`` and non-decreasing ``y``
  in every component, linear between consecutive points.
* A *jump* is two consecutive points with the same ``x``: the first carries the value at ``x``,
  the second the limit from the right. So every function is **left-continuous**: at a
  discontinuity the value is the left limit ("a fundamental property" of the strategy in
  YTsaurus's tests, ``TestNonContinuousFairShareFunctionIsLeftContinuous``).
* Outside its domain a function is extended by its end values.

The one non-obvious operation is :func:`fit`, which builds *max fit factor by suggestion* and
*fair share by suggestion* together in one sweep over *fair share by fit factor* (below).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

#: A scalar: exact or float, never both in one computation.
Number = Fraction | float
#: A point in resource space: one share per resource, in the tree's resource order.
Vector = tuple[Number, ...]

ZERO = Fraction(0)
ONE = Fraction(1)


def zeros(size: int) -> Vector:
    return (ZERO,) * size


def add(a: Vector, b: Vector) -> Vector:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def sub(a: Vector, b: Vector) -> Vector:
    return tuple(x - y for x, y in zip(a, b, strict=True))


def scale(a: Vector, factor: Number) -> Vector:
    return tuple(x * factor for x in a)


def vmin(a: Vector, b: Vector) -> Vector:
    return tuple(min(x, y) for x, y in zip(a, b, strict=True))


def dominated(a: Vector, b: Vector) -> bool:
    """``a <= b`` in every component."""
    return all(x <= y for x, y in zip(a, b, strict=True))


def total(vectors: Iterable[Vector], size: int) -> Vector:
    result = zeros(size)
    for vector in vectors:
        result = add(result, vector)
    return result


def _lerp(y0: Vector, y1: Vector, t: Number) -> Vector:
    return tuple(a + (b - a) * t for a, b in zip(y0, y1, strict=True))


@dataclass(frozen=True, slots=True)
class Function:
    """A monotone, left-continuous, piecewise-linear map from a scalar to a vector."""

    xs: tuple[Number, ...]
    ys: tuple[Vector, ...]

    @property
    def start(self) -> Number:
        return self.xs[0]

    @property
    def end(self) -> Number:
        return self.xs[-1]

    @classmethod
    def constant(cls, value: Vector, start: Number = ZERO, end: Number = ONE) -> Function:
        return cls((start, end), (value, value))

    def _interpolate(self, index: int, x: Number) -> Vector:
        """Value at ``x``, strictly between points ``index - 1`` and ``index``."""
        x0, x1 = self.xs[index - 1], self.xs[index]
        return _lerp(self.ys[index - 1], self.ys[index], (x - x0) / (x1 - x0))

    def __call__(self, x: Number) -> Vector:
        """The value at ``x``; at a jump, the left limit."""
        index = bisect_left(self.xs, x)
        if index == len(self.xs):
            return self.ys[-1]
        if self.xs[index] == x or index == 0:
            return self.ys[index]
        return self._interpolate(index, x)

    def right(self, x: Number) -> Vector:
        """The limit from the right at ``x`` (the value itself where there is no jump)."""
        index = bisect_right(self.xs, x)
        if index == 0:
            return self.ys[0]
        if self.xs[index - 1] == x or index == len(self.xs):
            return self.ys[index - 1]
        return self._interpolate(index, x)

    def stretched(self, factor: Number, end: Number) -> Function:
        """``x -> self(min(x * factor, self.end))`` on ``[start / factor, end]``.

        A fair-share pool gives a child of weight ``w`` the suggestion ``min(1, f * w / w_min)``:
        that child's function with its argument stretched by ``w / w_min``, constant after it
        saturates.
        """
        if factor == 1:
            xs = list(self.xs)
        else:
            xs = [x / factor for x in self.xs]
        ys = list(self.ys)
        if xs[-1] < end:
            xs.append(end)
            ys.append(ys[-1])
        return Function(tuple(xs), tuple(ys))

    def shifted(self, dx: Number, dy: Vector) -> Function:
        return Function(tuple(x + dx for x in self.xs), tuple(add(y, dy) for y in self.ys))

    @classmethod
    def concatenation(cls, pieces: Sequence[Function]) -> Function:
        """Pieces laid end to end: piece ``k`` on ``[k, k + 1]``, on top of all earlier pieces'
        end values. This is a FIFO pool: child ``k`` gets nothing until every earlier child has
        been suggested the whole cluster."""
        xs: list[Number] = []
        ys: list[Vector] = []
        offset: Vector | None = None
        for index, piece in enumerate(pieces):
            base = offset if offset is not None else zeros(len(piece.ys[0]))
            moved = piece.shifted(index - piece.start, base)
            start = 1 if xs and moved.ys[0] == ys[-1] else 0
            xs.extend(moved.xs[start:])
            ys.extend(moved.ys[start:])
            offset = ys[-1]
        return _simplified(xs, ys)

    @classmethod
    def sum(cls, functions: Sequence[Function]) -> Function:
        """Pointwise sum of functions with a common domain, jumps included.

        A sweep over all breakpoints that carries the running slope, so the cost is linear in
        the total number of points (evaluating every function at every breakpoint would be
        quadratic in a pool's number of children)."""
        if len(functions) == 1:
            return functions[0]
        size = len(functions[0].ys[0])
        slope_changes: dict[Number, list[Number]] = {}
        jumps: dict[Number, list[Number]] = {}
        end = functions[0].end
        for function in functions:
            xs, ys = function.xs, function.ys
            for index in range(len(xs) - 1):
                x0, x1 = xs[index], xs[index + 1]
                y0, y1 = ys[index], ys[index + 1]
                if x0 == x1:
                    jump = jumps.get(x0)
                    if jump is None:
                        jumps[x0] = [b - a for a, b in zip(y0, y1, strict=True)]
                    else:
                        for r in range(size):
                            jump[r] += y1[r] - y0[r]
                    continue
                width = x1 - x0
                if isinstance(width, float) and width <= 1e-13 * (1.0 + abs(float(x0))):
                    # A rounding residue of a jump: keep it a jump.
                    jump = jumps.get(x0)
                    if jump is None:
                        jumps[x0] = [b - a for a, b in zip(y0, y1, strict=True)]
                    else:
                        for r in range(size):
                            jump[r] += y1[r] - y0[r]
                    continue
                slope = [(b - a) / width for a, b in zip(y0, y1, strict=True)]
                if not any(slope):
                    continue
                change = slope_changes.get(x0)
                if change is None:
                    slope_changes[x0] = list(slope)
                else:
                    for r in range(size):
                        change[r] += slope[r]
                change = slope_changes.get(x1)
                if change is None:
                    slope_changes[x1] = [-s for s in slope]
                else:
                    for r in range(size):
                        change[r] -= slope[r]
        breaks = sorted({*slope_changes, *jumps, end, functions[0].start})
        value = list(total((function.ys[0] for function in functions), size))
        slope_now: list[Number] = [ZERO * 0] * size if isinstance(end, Fraction) else [0.0] * size
        previous = breaks[0]
        out_x: list[Number] = []
        out_y: list[Vector] = []
        last = breaks[-1]
        for x in breaks:
            step = x - previous
            if step:
                for r in range(size):
                    if slope_now[r]:
                        value[r] += slope_now[r] * step
            out_x.append(x)
            out_y.append(tuple(value))
            jump = jumps.get(x)
            if jump is not None and x != last:
                for r in range(size):
                    value[r] += jump[r]
                out_x.append(x)
                out_y.append(tuple(value))
            change = slope_changes.get(x)
            if change is not None:
                for r in range(size):
                    slope_now[r] += change[r]
            previous = x
        return _simplified(out_x, out_y)


@dataclass(frozen=True, slots=True)
class Fitted:
    """*Max fit factor by suggestion* (``ms``) and *fair share by suggestion* (``ys``) of one
    element, on common breakpoints ``xs`` (the suggestion, over [0, 1]); both left-continuous
    except at 0, where they take the value at 0 itself."""

    xs: tuple[Number, ...]
    ms: tuple[Number, ...]
    ys: tuple[Vector, ...]

    def at(self, s: Number) -> tuple[Number, Vector]:
        """``(max fit factor, fair share)`` at suggestion ``s``; at a jump, the left limit."""
        xs = self.xs
        index = bisect_left(xs, s)
        if index == len(xs):
            return self.ms[-1], self.ys[-1]
        if xs[index] == s or index == 0:
            return self.ms[index], self.ys[index]
        x0, x1 = xs[index - 1], xs[index]
        t = (s - x0) / (x1 - x0)
        m0 = self.ms[index - 1]
        return m0 + (self.ms[index] - m0) * t, _lerp(self.ys[index - 1], self.ys[index], t)

    @property
    def by_suggestion(self) -> Function:
        return _simplified(list(self.xs), list(self.ys))

    @property
    def fit_factor_by_suggestion(self) -> Function:
        return _simplified(list(self.xs), [(m,) for m in self.ms])


def fit(function: Function, guarantee: Vector, limits: Vector) -> Fitted:
    """``PrepareMaxFitFactorBySuggestion`` and the composition after it, in one sweep.

    ``function`` is an element's *fair share by fit factor* (FSBFF) and ``guarantee <= limits``
    are already clamped into its range. A suggestion ``s`` stands for the bound
    ``min(guarantee + s, limits)``; *max fit factor by suggestion* (MFFBS) is the largest fit
    factor whose FSBFF stays within that bound in every resource.

    Write ``sigma(f) = max_r (FSBFF_r(f) - guarantee_r)``: a fit factor is allowed under
    suggestion ``s`` iff ``sigma(f) <= s`` and ``FSBFF(f) <= limits``. So MFFBS is the
    *transpose* of the scalar, monotone, piecewise-linear ``sigma`` on the part of the domain
    the limits allow: walk FSBFF's points once, cut it where it leaves the limits, add the
    points where the resource defining ``sigma`` changes inside a segment (the upper envelope
    of at most a handful of lines), and swap the axes. Fair share by suggestion is FSBFF at
    that fit factor, known at every point of the walk, and linear between them. Flat parts of
    ``sigma`` become jumps of MFFBS and jumps of FSBFF become flat parts, with the
    left-continuous convention (the value at ``s = 0`` is MFFBS's own, as YTsaurus samples it).
    """
    xs, ys = function.xs, function.ys
    size = len(guarantee)
    resources = range(size)
    # (sigma, fit factor, fair share) along FSBFF, cut at the limits.
    walk: list[tuple[Number, Number, Vector]] = []
    # Floats: sums drift by a few ulps, so the limits get a relative 1e-12 of slack.
    ceilings = (
        tuple(float(lim) + 1e-12 * (1.0 + abs(float(lim))) for lim in limits)
        if isinstance(xs[0], float)
        else limits
    )
    px: Number = xs[0]
    py: Vector = ys[0]
    sigma_prev = max(py[r] - guarantee[r] for r in resources)
    walk.append((sigma_prev, px, py))
    for index in range(1, len(xs)):
        x, y = xs[index], ys[index]
        over = [r for r in resources if y[r] > ceilings[r]]
        if x == px:
            if over:
                break
            sigma = max(y[r] - guarantee[r] for r in resources)
            if sigma < sigma_prev:  # float rounding only
                sigma = sigma_prev
            walk.append((sigma, x, y))
            px, py, sigma_prev = x, y, sigma
            continue
        end: Number = ONE if not isinstance(x, float) else 1.0
        if over:
            end = min((limits[r] - py[r]) / (y[r] - py[r]) for r in over)
        # The upper envelope of the lines c_r + t * m_r, t in [0, end].
        c = [py[r] - guarantee[r] for r in resources]
        m = [y[r] - py[r] for r in resources]
        current = max(resources, key=lambda r: (c[r], m[r]))
        top = max(c[r] + m[r] * end for r in resources)
        if c[current] + m[current] * end < top:
            t: Number = ZERO * 0 if not isinstance(x, float) else 0.0
            while True:
                best: int | None = None
                best_t = end
                for q in resources:
                    if m[q] > m[current]:
                        crossing = (c[current] - c[q]) / (m[q] - m[current])
                        if t < crossing < best_t or (
                            best is not None and crossing == best_t and m[q] > m[best]
                        ):
                            best, best_t = q, crossing
                if best is None:
                    break
                t, current = best_t, best
                sigma = c[current] + m[current] * t
                if sigma < sigma_prev:
                    sigma = sigma_prev
                walk.append((sigma, px + (x - px) * t, _lerp(py, y, t)))
                sigma_prev = sigma
        if over:
            if end > 0:
                cut_y = _lerp(py, y, end)
                sigma = max(sigma_prev, max(cut_y[r] - guarantee[r] for r in resources))
                walk.append((sigma, px + (x - px) * end, cut_y))
            break
        sigma = max(sigma_prev, max(y[r] - guarantee[r] for r in resources))
        walk.append((sigma, x, y))
        px, py, sigma_prev = x, y, sigma
    if isinstance(xs[0], float):
        walk = _settled(walk)
    # A fit factor never passes the end of the walk, so a jump there is never taken: the
    # share stays at the left value.
    while len(walk) > 1 and walk[-1][1] == walk[-2][1]:
        walk.pop()
    # Swap the axes: s = sigma. A jump of FSBFF that raises sigma keeps the left value until
    # the suggestion reaches the right one.
    ss: list[Number] = []
    ms: list[Number] = []
    vs: list[Vector] = []
    previous: tuple[Number, Number, Vector] | None = None
    for point in walk:
        if previous is not None and point[1] == previous[1] and point[0] > previous[0]:
            ss.append(point[0])
            ms.append(previous[1])
            vs.append(previous[2])
        ss.append(point[0])
        ms.append(point[1])
        vs.append(point[2])
        previous = point
    return _clip(ss, ms, vs)


def _settled(walk: list[tuple[Number, Number, Vector]]) -> list[tuple[Number, Number, Vector]]:
    """Floats only: sigma values within 1e-12 of 0, of 1 or of the previous distinct value
    are made equal to it, so that flat parts stay flat (exact arithmetic has exact ties; a
    rounding residue would turn a jump into a segment of enormous slope)."""
    settled: list[tuple[Number, Number, Vector]] = []
    anchor: float | None = None
    for value, x, y in walk:
        sigma = float(value)
        if abs(sigma) <= 1e-12:
            sigma = 0.0
        elif abs(sigma - 1.0) <= 1e-12:
            sigma = 1.0
        if anchor is not None and sigma - anchor <= 1e-12 * (1.0 + abs(float(anchor))):
            sigma = anchor
        else:
            anchor = sigma
        settled.append((sigma, x, y))
    return settled


def _clip(ss: list[Number], ms: list[Number], vs: list[Vector]) -> Fitted:
    """The transposed walk restricted to suggestions in [0, 1], extended right to 1."""
    zero: Number = 0.0 if isinstance(ss[0], float) else ZERO
    one: Number = 1.0 if isinstance(ss[0], float) else ONE
    last_at_or_below = bisect_right(ss, zero) - 1
    j = max(last_at_or_below, 0)
    out_s: list[Number] = []
    out_m: list[Number] = []
    out_v: list[Vector] = []
    if j + 1 < len(ss) and ss[j] < 0 < ss[j + 1]:
        t = (zero - ss[j]) / (ss[j + 1] - ss[j])
        out_s.append(zero)
        out_m.append(ms[j] + (ms[j + 1] - ms[j]) * t)
        out_v.append(_lerp(vs[j], vs[j + 1], t))
    else:
        # The value at 0 is MFFBS(0) itself (the right end of a jump at 0) and FSBFF's
        # left-continuous value there: the first point at that fit factor.
        m0 = ms[j]
        k = j
        while k > 0 and ms[k - 1] == m0:
            k -= 1
        out_s.append(zero)
        out_m.append(m0)
        out_v.append(vs[k])
        if vs[j] != vs[k]:
            out_s.append(zero)
            out_m.append(m0)
            out_v.append(vs[j])
    for index in range(j + 1, len(ss)):
        s = ss[index]
        if s <= 0:
            continue
        if s < 1:
            out_s.append(s)
            out_m.append(ms[index])
            out_v.append(vs[index])
            continue
        if s == 1:
            out_s.append(s)
            out_m.append(ms[index])
            out_v.append(vs[index])
        else:
            s0, m0, v0 = out_s[-1], out_m[-1], out_v[-1]
            t = (one - s0) / (s - s0)
            out_s.append(one)
            out_m.append(m0 + (ms[index] - m0) * t)
            out_v.append(_lerp(v0, vs[index], t))
        break
    if out_s[-1] < one:
        out_s.append(one)
        out_m.append(out_m[-1])
        out_v.append(out_v[-1])
    return Fitted(tuple(out_s), tuple(out_m), tuple(out_v))


def _straight(x0: Number, x1: Number, x2: Number, y0: Vector, y1: Vector, y2: Vector) -> bool:
    """Whether ``(x1, y1)`` lies on the segment from ``(x0, y0)`` to ``(x2, y2)``: exactly
    for fractions, to a relative 1e-12 for floats."""
    if not x0 < x1 < x2:
        return False
    a, b = x2 - x1, x1 - x0
    if isinstance(x1, float):
        for u, v, w in zip(y0, y1, y2, strict=True):
            left, right = float((v - u) * a), float((w - v) * b)
            if abs(left - right) > 1e-12 * (abs(left) + abs(right)) + 1e-300:
                return False
        return True
    return all((v - u) * a == (w - v) * b for u, v, w in zip(y0, y1, y2, strict=True))


def _simplified(xs: list[Number], ys: list[Vector]) -> Function:
    """Drops interior points that neither bend nor jump, so functions stay small."""
    keep_x = [xs[0]]
    keep_y = [ys[0]]
    for index in range(1, len(xs) - 1):
        x1, y1 = xs[index], ys[index]
        if x1 == keep_x[-1] and y1 == keep_y[-1]:
            continue
        if not _straight(keep_x[-1], x1, xs[index + 1], keep_y[-1], y1, ys[index + 1]):
            keep_x.append(x1)
            keep_y.append(y1)
    if len(xs) > 1 and not (xs[-1] == keep_x[-1] and ys[-1] == keep_y[-1]):
        keep_x.append(xs[-1])
        keep_y.append(ys[-1])
    if len(keep_x) == 1:
        keep_x.append(keep_x[0])
        keep_y.append(keep_y[0])
    return Function(tuple(keep_x), tuple(keep_y))


__all__ = [
    "ONE",
    "ZERO",
    "Fitted",
    "Function",
    "Number",
    "Vector",
    "add",
    "dominated",
    "fit",
    "scale",
    "sub",
    "total",
    "vmin",
    "zeros",
]
