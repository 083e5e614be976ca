"""Monotone piecewise-linear vector functions over exact rationals: the calculus of vector HDRF.

YTsaurus's ``library/vector_hdrf`` describes every element of a pool tree by monotone
piecewise-linear functions (fair share by fit factor, max fit factor by suggestion, fair share
by suggestion) and combines them by summing, shifting, inverting and composing. This module is
that toolbox, in ``fractions.Fraction`` so that results are exact and reproducible byte for byte.

Conventions, the same as YTsaurus's:

* A function is a list of points ``(x, y)`` with non-decreasing ``x`` and non-decreasing ``y``
  in every component, linear between consecutive points.
* A *jump* is two consecutive points with the same ``x``: the first carries the value at ``x``,
  the second the limit from the right. So every function is **left-continuous**: at a
  discontinuity the value is the left limit ("a fundamental property" of the strategy in
  YTsaurus's tests, ``TestNonContinuousFairShareFunctionIsLeftContinuous``).
* Outside its domain a function is extended by its end values.

The one non-obvious constructor is :meth:`Function.from_breakpoints`: given every point where a
function may bend or jump, and a way to evaluate it anywhere, it samples each interval at two
interior points and extrapolates to both ends. With exact arithmetic this rebuilds a piecewise
linear function exactly, including left and right limits at jumps, whatever convention the
evaluator uses *at* the breakpoints themselves.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise

#: A point in resource space: one exact share per resource, in the tree's resource order.
Vector = tuple[Fraction, ...]

ZERO = Fraction(0)
ONE = Fraction(1)


def zeros(size: int) -> Vector:
    return (ZERO,) * size


def add(a: Vector, b: Vector) -> Vector:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def sub(a: Vector, b: Vector) -> Vector:
    return tuple(x - y for x, y in zip(a, b, strict=True))


def scale(a: Vector, factor: Fraction) -> Vector:
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


@dataclass(frozen=True, slots=True)
class Function:
    """A monotone, left-continuous, piecewise-linear map from a scalar to a vector."""

    xs: tuple[Fraction, ...]
    ys: tuple[Vector, ...]

    @property
    def start(self) -> Fraction:
        return self.xs[0]

    @property
    def end(self) -> Fraction:
        return self.xs[-1]

    @classmethod
    def constant(cls, value: Vector, start: Fraction = ZERO, end: Fraction = ONE) -> Function:
        return cls((start, end), (value, value))

    def _interpolate(self, index: int, x: Fraction) -> Vector:
        """Value at ``x``, strictly between points ``index - 1`` and ``index``."""
        x0, x1 = self.xs[index - 1], self.xs[index]
        y0, y1 = self.ys[index - 1], self.ys[index]
        t = (x - x0) / (x1 - x0)
        return tuple(a + (b - a) * t for a, b in zip(y0, y1, strict=True))

    def __call__(self, x: Fraction) -> Vector:
        """The value at ``x``; at a jump, the left limit."""
        index = bisect_left(self.xs, x)
        if index == len(self.xs):
            return self.ys[-1]
        if self.xs[index] == x or index == 0:
            return self.ys[index]
        return self._interpolate(index, x)

    def right(self, x: Fraction) -> Vector:
        """The limit from the right at ``x`` (the value itself where there is no jump)."""
        index = bisect_right(self.xs, x)
        if index == 0:
            return self.ys[0]
        if self.xs[index - 1] == x or index == len(self.xs):
            return self.ys[index - 1]
        return self._interpolate(index, x)

    def max_argument(self, component: int, bound: Fraction) -> Fraction:
        """The largest ``x`` in the domain with ``self(x)[component] <= bound``.

        This is the transposed (inverse) function of one component. It exists because the
        function is left-continuous and monotone: the set of such ``x`` is a closed interval
        starting at the domain's start (callers never pass a bound below ``self(start)``).
        """
        first_above = bisect_right(self.ys, bound, key=lambda y: y[component])
        if first_above == len(self.ys):
            return self.xs[-1]
        if first_above == 0:
            return self.xs[0]
        x0, x1 = self.xs[first_above - 1], self.xs[first_above]
        if x0 == x1:
            return x0
        y0, y1 = self.ys[first_above - 1][component], self.ys[first_above][component]
        return x0 + (bound - y0) * (x1 - x0) / (y1 - y0)

    def stretched(self, factor: Fraction, end: Fraction) -> Function:
        """``x -> self(min(x * factor, self.end))`` on ``[start / factor, end]``.

        A fair-share pool gives a child of weight ``w`` the suggestion ``min(1, f * w / w_min)``:
        that child's function with its argument stretched by ``w / w_min``, constant after it
        saturates.
        """
        xs = [x / factor for x in self.xs]
        ys = list(self.ys)
        if xs[-1] < end:
            xs.append(end)
            ys.append(ys[-1])
        return Function(tuple(xs), tuple(ys))

    def shifted(self, dx: Fraction, dy: Vector) -> Function:
        return Function(tuple(x + dx for x in self.xs), tuple(add(y, dy) for y in self.ys))

    @classmethod
    def concatenation(cls, pieces: Sequence[Function]) -> Function:
        """Pieces laid end to end: piece ``k`` on ``[k, k + 1]``, on top of all earlier pieces'
        end values. This is a FIFO pool: child ``k`` gets nothing until every earlier child has
        been suggested the whole cluster."""
        xs: list[Fraction] = []
        ys: list[Vector] = []
        offset: Vector | None = None
        for index, piece in enumerate(pieces):
            base = offset if offset is not None else zeros(len(piece.ys[0]))
            moved = piece.shifted(Fraction(index) - piece.start, base)
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
        size = len(functions[0].ys[0])
        slope_changes: dict[Fraction, Vector] = {}
        jumps: dict[Fraction, Vector] = {}
        for function in functions:
            for (x0, y0), (x1, y1) in pairwise(zip(function.xs, function.ys, strict=True)):
                if x0 == x1:
                    jumps[x0] = add(jumps.get(x0, zeros(size)), sub(y1, y0))
                else:
                    slope = scale(sub(y1, y0), 1 / (x1 - x0))
                    slope_changes[x0] = add(slope_changes.get(x0, zeros(size)), slope)
                    slope_changes[x1] = sub(slope_changes.get(x1, zeros(size)), slope)
        breaks = sorted({*slope_changes, *jumps, functions[0].end})
        value = total((function.ys[0] for function in functions), size)
        slope = zeros(size)
        previous = breaks[0]
        xs: list[Fraction] = []
        ys: list[Vector] = []
        for x in breaks:
            value = add(value, scale(slope, x - previous))
            xs.append(x)
            ys.append(value)
            if x in jumps and x != breaks[-1]:
                value = add(value, jumps[x])
                xs.append(x)
                ys.append(value)
            slope = add(slope, slope_changes.get(x, zeros(size)))
            previous = x
        return _simplified(xs, ys)

    @classmethod
    def from_breakpoints(
        cls, breaks: Iterable[Fraction], evaluate: Callable[[Fraction], Vector]
    ) -> Function:
        """The left-continuous piecewise-linear function that equals ``evaluate`` between
        consecutive ``breaks`` (which must include both ends of the domain).

        At the domain's start the value is ``evaluate(start)``; at every other breakpoint it is
        the left limit, and a jump is recorded when the right limit differs.
        """
        points = sorted(set(breaks))
        xs: list[Fraction] = [points[0]]
        ys: list[Vector] = [evaluate(points[0])]
        for low, high in pairwise(points):
            third = (high - low) / 3
            a, b = evaluate(low + third), evaluate(high - third)
            slope = scale(sub(b, a), 1 / third)
            right_of_low = sub(a, scale(slope, third))
            if right_of_low != ys[-1]:
                xs.append(low)
                ys.append(right_of_low)
            xs.append(high)
            ys.append(add(b, scale(slope, third)))
        return _simplified(xs, ys)


def _simplified(xs: list[Fraction], ys: list[Vector]) -> Function:
    """Drops interior points that neither bend nor jump, so functions stay small."""
    keep_x = [xs[0]]
    keep_y = [ys[0]]
    for index in range(1, len(xs) - 1):
        x0, x1, x2 = keep_x[-1], xs[index], xs[index + 1]
        y0, y1, y2 = keep_y[-1], ys[index], ys[index + 1]
        straight = x0 < x1 < x2 and scale(sub(y1, y0), x2 - x1) == scale(sub(y2, y1), x1 - x0)
        if not straight and not (x1 == x0 and y1 == y0):
            keep_x.append(x1)
            keep_y.append(y1)
    if len(xs) > 1 and not (xs[-1] == keep_x[-1] and ys[-1] == keep_y[-1]):
        keep_x.append(xs[-1])
        keep_y.append(ys[-1])
    if len(keep_x) == 1:
        keep_x.append(keep_x[0])
        keep_y.append(keep_y[0])
    return Function(tuple(keep_x), tuple(keep_y))
