"""infra: small effect helpers with no GPU or claim knowledge (atomic files, commands,
locks, time budgets, logs, metrics registry, API clients).
May import: model."""
