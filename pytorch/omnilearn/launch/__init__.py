"""Launchers and their supervision: local processes (:mod:`.local`, the embedded default), Docker Swarm
containers (:mod:`.docker`), any command's ranks (:mod:`.emulate`); one supervise loop (:mod:`.supervise`),
failures, restarts, and what a job leaves on disk (:mod:`.pidfile`, :mod:`.cleanup`). Whole experiments
are in :mod:`omnilearn.experiments`, image building in :mod:`omnilearn.images`, live observers in
:mod:`omnilearn.observe`."""
