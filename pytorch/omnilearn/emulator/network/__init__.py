"""The network mechanisms: links shaped with tc (:mod:`.shaping`), local workers' network namespaces
(:mod:`.netns`) and containers' links on their overlay veths (:mod:`.docker_net`)."""
