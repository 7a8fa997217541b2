"""The CPU-request protocol between workers and the host: request lines and their bounded parser
(:mod:`.requests`), the workers' side (:mod:`.client`), the append-only audit that is the toggler's only
state (:mod:`.audit`), the toggler that applies what the plan allows (:mod:`.toggler`, its retries in
:mod:`.retry`), and the one way it is hosted (:mod:`.toggler_host`)."""
