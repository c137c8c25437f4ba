"""Generated gRPC stubs for the kubelet plugin APIs and the ResourceClaim protobuf subset the
claim status writer uses. Do not edit: run hack/gen-proto."""
