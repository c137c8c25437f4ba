"""kubelet: the kubelet-facing gRPC services (registration, DRA v1/v1beta1, resource
health) over unix sockets.
May import: model, infra, prepare, and the generated _proto."""
