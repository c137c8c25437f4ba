"""prepare: a claim from the kubelet's call to its CDI spec (read, plan, over-commit
check, enforce, write, record) and back (unprepare); the checkpoint.
May import: model, infra, config, gpus, enforce, and the generated _proto."""
