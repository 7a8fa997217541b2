"""Image building for the Docker launcher: the worker image (:mod:`.worker`), its locally made base
(:mod:`.base`) and a workload's requirements layer (:mod:`.requirements`)."""
