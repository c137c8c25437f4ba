"""observe: what the driver reports (claim device status, accounting metrics, the
cluster's occupancy, root MPS clients).
May import: model, infra, config, prepare, enforce, enforce.rules, enforce.mps, _proto."""
