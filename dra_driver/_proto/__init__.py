"""Generated gRPC stubs for the kubelet plugin APIs. Do not edit: run hack/gen-proto."""
