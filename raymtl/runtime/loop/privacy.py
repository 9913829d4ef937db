"""The ε a run has spent, round by round (docs/ALGORITHMS.md §9.3): the driver's half of
client-level DP. The hosts clip and add the noise; this asks a maintained accountant
(raymtl/toolbox/accounting.py: dp-accounting) what that noise bought.

    central noise:  the sampled Gaussian mechanism, noise multiplier σ, q = m/N, composed
                    over the t rounds run (`privacy.accounting` says which neighbours)
    local noise:    each client's own Gaussian releases (sensitivity 2C), composed over the
                    rounds it took part in, without amplification; the maximum over clients
"""

from __future__ import annotations

import math
from collections import Counter

from raymtl.algorithms.training import sample_size
from raymtl.config import ExperimentConfig
from raymtl.runtime.loop.sampling import sample_clients


class PrivacyLedger:
    """ε after each round of one seed (NaN without client-level DP)."""

    def __init__(self, cfg: ExperimentConfig, seed: int):
        self.cfg, self.seed = cfg, seed
        self.privacy = cfg.privacy
        self.population = cfg.data.num_clients
        self.fraction = cfg.algorithm.typed_params().sample_fraction
        self._taken: Counter = Counter()  # local DP: releases per client so far
        self._counted = 0  # rounds counted into _taken

    @property
    def delta(self) -> float:
        from raymtl.toolbox.privacy import default_delta

        given = self.privacy.delta
        return given if given is not None else default_delta(self.population)

    def epsilon(self, round_index: int) -> float:
        if not self.privacy.client_level:
            return math.nan
        from raymtl.toolbox.accounting import central_epsilon, local_epsilon

        sigma = self.privacy.noise_multiplier
        if self.privacy.noise == "local":
            return local_epsilon(sigma, self.most_releases(round_index), self.delta)
        cohort = sample_size(self.fraction, self.population)
        return central_epsilon(
            sigma, cohort, self.population, round_index, self.delta, self.privacy.accounting
        )

    def most_releases(self, round_index: int) -> int:
        """The most rounds any client took part in, up to `round_index` (a resumed run counts
        the rounds before it again: the cohorts are seeded)."""
        if round_index < self._counted:
            self._taken, self._counted = Counter(), 0
        while self._counted < round_index:
            self._counted += 1
            self._taken.update(
                sample_clients(
                    self.seed, self._counted, self.population, self.fraction, self.cfg.sampling
                )
            )
        return max(self._taken.values(), default=0)
