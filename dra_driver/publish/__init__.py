"""publish: the node's offer as ResourceSlices (devices, counters, taints, health),
kept in sync with the API server; the DeviceClasses and the sizing admission policies.
May import: model, infra, config."""
