"""observe: what the plugin reports (claim device status, accounting metrics, MPS outages,
pod events, root MPS clients).
May import: model, infra, prepare, enforce, enforce.rules, enforce.mps, _proto."""
