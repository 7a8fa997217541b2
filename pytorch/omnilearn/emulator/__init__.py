"""The heterogeneity emulator, in four parts: what to emulate (:mod:`.spec`), the request protocol between
workers and the toggler (:mod:`.protocol`), and the mechanisms that apply it: CPU, memory and stalls
(:mod:`.backends`), links (:mod:`.network`)."""
