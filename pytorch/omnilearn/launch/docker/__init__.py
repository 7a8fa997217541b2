"""The container launcher: the daemon (:mod:`.daemon`), the worker image (:mod:`.images`) and its locally made
base (:mod:`.base_image`), and the job's containers on a Swarm overlay network (:mod:`.swarm`)."""
