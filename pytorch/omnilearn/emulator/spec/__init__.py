"""What to emulate: heterogeneity levels and their allocations (:mod:`.levels`), schedules (:mod:`.schedule`),
traces (:mod:`.trace` and its parser, converter and plan), per-worker links (:mod:`.links`), calibration
tables (:mod:`.calibration`), all resolved into one job's :class:`~.plan.EmulationPlan` (:mod:`.plan`).

Pure descriptions: nothing here touches the kernel, a container or a request log."""
