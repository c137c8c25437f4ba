"""The kubelet-facing gRPC services: registration, DRA v1/v1beta1, resource health."""
