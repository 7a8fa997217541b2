"""Whole experiment commands over the launchers: ``omnilearn bench`` (:mod:`.bench` over a :mod:`.matrix` of
cells) and ``omnilearn calibrate`` (:mod:`.calibrate`)."""
