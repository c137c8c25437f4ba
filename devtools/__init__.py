"""The project's developer tools: the local cluster and its real nodes, the container images,
``make demo`` and the GPU node check, as modules (``python -m devtools.<tool>`` or the entry
points in ``hack/``, see hack/README.md). Not part of the shipped package."""
