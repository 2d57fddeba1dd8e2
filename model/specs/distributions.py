"""Distributions of a workload profile, as data: a fixed value, a lognormal, empirical quantiles
(fitted from a trace by `model.fit.workload`), or a weighted mixture of those, with optional
clipping bounds (`Distribution`). Each samples with a caller's numpy Generator and has a mean."""

from __future__ import annotations

import functools
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ProfileModel(BaseModel):
    """Base of the workload profile schema: unknown keys fail, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Fixed(ProfileModel):
    kind: Literal["fixed"]
    value: float = Field(ge=0)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, float(self.value))

    def mean(self) -> float:
        return float(self.value)


class Lognormal(ProfileModel):
    kind: Literal["lognormal"]
    mu: float  # mean of ln x
    sigma: float = Field(ge=0)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.lognormal(self.mu, self.sigma, n)

    def mean(self) -> float:
        return float(np.exp(self.mu + self.sigma**2 / 2))


@functools.lru_cache(maxsize=256)
def _quantile_arrays(p: tuple[float, ...], x: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The quantiles as numpy arrays, made once: a request mix samples them per session, tens of
    thousands of times."""
    return np.asarray(p, float), np.asarray(x, float)


class Empirical(ProfileModel):
    """Quantiles of a measured distribution; sampled by inverse CDF, linear between quantiles."""

    kind: Literal["empirical"]
    p: tuple[float, ...]  # increasing probabilities from 0 to 1
    x: tuple[float, ...]  # the matching quantiles (non-decreasing)

    @model_validator(mode="after")
    def _check(self) -> Empirical:
        p, x = np.asarray(self.p), np.asarray(self.x)
        if len(p) != len(x) or len(p) < 2:
            raise ValueError("p and x must have the same length (at least 2)")
        if p[0] != 0.0 or p[-1] != 1.0 or np.any(np.diff(p) <= 0):
            raise ValueError("p must increase strictly from 0 to 1")
        if np.any(np.diff(x) < 0):
            raise ValueError("x must be non-decreasing")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.interp(rng.random(n), *_quantile_arrays(self.p, self.x))

    def mean(self) -> float:
        p, x = np.asarray(self.p), np.asarray(self.x)
        return float(np.sum(np.diff(p) * (x[1:] + x[:-1]) / 2))


class Component(ProfileModel):
    weight: float = Field(gt=0)
    dist: Annotated[Fixed | Lognormal | Empirical, Field(discriminator="kind")]


class Mixture(ProfileModel):
    kind: Literal["mixture"]
    components: tuple[Component, ...] = Field(min_length=1)

    def _weights(self) -> np.ndarray:
        w = np.array([c.weight for c in self.components])
        return w / w.sum()

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        which = rng.choice(len(self.components), size=n, p=self._weights())
        out = np.empty(n)
        for i, comp in enumerate(self.components):
            sel = which == i
            out[sel] = comp.dist.sample(rng, int(sel.sum()))
        return out

    def mean(self) -> float:
        return float(sum(w * c.dist.mean() for w, c in zip(self._weights(), self.components, strict=True)))


DistKind = Annotated[Fixed | Lognormal | Empirical | Mixture, Field(discriminator="kind")]


class Distribution(ProfileModel):
    """A distribution plus optional clipping bounds (applied after sampling)."""

    dist: DistKind
    min: float | None = None
    max: float | None = None
    source: str = ""  # where the numbers come from (trace, paper, fit date)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        values = self.dist.sample(rng, n)
        if self.min is None and self.max is None:
            return values
        lo = -np.inf if self.min is None else self.min
        hi = np.inf if self.max is None else self.max
        return np.clip(values, lo, hi)

    def mean(self) -> float:
        """Mean before clipping (clipping only trims rare tails)."""
        return self.dist.mean()
