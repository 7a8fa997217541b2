"""A change of the whole cluster, read from the step's common factor (control/changes.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from omnilearn.control.changes import ClusterEvents
from omnilearn.control.model import SpeedModel
from omnilearn.control.priors import PRIORS

B, N = 256, 4


def _events() -> ClusterEvents:
    return ClusterEvents(PRIORS.noise, PRIORS.noise_weight, PRIORS.noise_memory, PRIORS.jump)


def _times(speed: np.ndarray, batch: int, rng: np.random.Generator, noise: float, host: float) -> list[float]:
    """One step's times: every worker's own noise and the host's, common to the step."""
    common = math.exp(rng.normal(0, host))
    return (batch / speed * 1e-3 * common * np.exp(rng.normal(0, noise, len(speed)))).tolist()


def test_a_jump_of_the_common_factor_is_an_event_and_its_noise_is_not() -> None:
    rng = np.random.default_rng(0)
    events = _events()
    level = 0.0
    assert events.observe(level, 0.01) == 0.0  # nothing to compare the first step with
    for _ in range(30):
        assert events.observe(level + rng.normal(0, 0.03), 0.01) < 0.5
    assert events.noise() == pytest.approx(0.03 * math.sqrt(2), rel=0.5)  # a change is a difference of two
    assert events.observe(level + 0.6, 0.01) > 0.9  # some 14 sds, under Student-t tails
    kept = len(events.changes)
    assert events.observe(level + 0.6, 0.01) < 0.5  # the new level is the next step's reference
    assert len(events.changes) == min(kept + 1, PRIORS.noise_memory)


def test_the_events_follow_the_estimate_s_terms_and_survive_a_round_trip() -> None:
    events = _events()
    events.observe(0.2, 0.01)
    events.shift(-0.2)  # the speeds re-centred: the same common factor now reads 0.2 lower
    assert events.observe(0.0, 0.01) < 0.5
    copy = _events()
    copy.load_state_dict(events.state_dict())
    assert (copy.last, copy.changes) == (events.last, events.changes)
    copy.load_state_dict(None)  # a state saved before the events were kept: no step before
    assert copy.last is None and copy.changes == []


def _first_step_taken(move: str, seeds: int = 40) -> tuple[int, int]:
    """Over ``seeds`` runs of 30 steps at 8% noise per worker and 5% per step on the host: how often the
    last worker's change (0.5 in log against the others, about six of its sds) is taken at its first
    step, and how many other workers are taken for changed there. ``move``: ``level`` (the others 1.6
    times slower as well: the step's common factor jumps), ``alone`` (only the last worker faster) or
    ``host`` (every worker 1.6 times slower alike: no relative change)."""
    taken = false = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        model, speed = SpeedModel(N, B), np.ones(N)
        for _ in range(30):
            model.update([64] * N, _times(speed, 64, rng, 0.08, 0.05))
        if move == "level":
            speed[:3] /= 1.6
            speed[3] *= math.exp(0.5) / 1.6
        elif move == "alone":
            speed[3] *= math.exp(0.5)
        else:
            speed /= 1.6
        changed, _ = model.update([64] * N, _times(speed, 64, rng, 0.08, 0.05))
        taken += 3 in changed
        false += sum(1 for i in changed if i != 3)
    return taken, false


def test_a_change_that_moves_the_whole_step_is_taken_at_its_first_step_more_often() -> None:
    """The same change of one worker against the others is likelier taken at once when the step's common
    factor jumped with it (a level change), and a host that slows every worker alike moves no speed."""
    level, level_false = _first_step_taken("level")
    alone, _ = _first_step_taken("alone")
    host_taken, host_false = _first_step_taken("host")
    assert level >= alone + 5, (level, alone)
    assert level_false == 0 and host_taken == 0 and host_false == 0
