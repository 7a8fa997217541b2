"""The container launcher: the daemon (:mod:`.daemon`) and the job's containers on a Swarm overlay network
(:mod:`.swarm`); the images they run are built by :mod:`omnilearn.images`."""
