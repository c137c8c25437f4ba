"""enforce.mps: the MPS client, run inside the kubelet plugin: control daemons started and
stopped, ``nvidia-cuda-mps-control`` commands, servers and namespaces ensured and removed, a
GPU's compute mode set, and the few NVML calls (real, or simulated for GPU-free nodes).
May import: model, infra, gpus, enforce.rules.
"""
