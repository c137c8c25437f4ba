"""publish: the node's offer as ResourceSlices (devices, counters, taints, health),
kept in sync with the API server.
May import: model, infra, config."""
