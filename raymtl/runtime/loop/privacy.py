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

from raymtl.config import ExperimentConfig
from raymtl.config.toolbox_checks import spent_epsilon
from raymtl.runtime.loop.sampling import sample_clients


class PrivacyLedger:
    """ε after each round of one seed (NaN without client-level DP); `fraction`: the
    algorithm's sample_fraction (its typed params')."""

    def __init__(self, cfg: ExperimentConfig, seed: int, fraction: float):
        self.cfg, self.seed = cfg, seed
        self.privacy = cfg.privacy
        self.population = cfg.data.num_clients
        self.fraction = fraction
        self._taken: Counter = Counter()  # local DP: releases per client so far
        self._counted = 0  # rounds counted into _taken

    def epsilon(self, round_index: int) -> float:
        if not self.privacy.client_level:
            return math.nan
        local = self.privacy.noise == "local"
        releases = self.most_releases(round_index) if local else None
        return spent_epsilon(self.cfg, round_index, releases)

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
