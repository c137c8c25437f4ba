"""An emulator of NVIDIA MPS for nodes without GPUs.

The control daemon's semantics are one state machine (:mod:`.state`), shared by the in-process
test fake (``tests/support/fakes/mps_control.py``) and the emulator program real processes
talk to: :func:`emulator_path` is an executable ``nvidia-cuda-mps-control`` (``-d`` starts a
daemon listening on ``$CUDA_MPS_PIPE_DIRECTORY/control``; each ``server create`` starts an
``nvidia-cuda-mps-server`` process with a socket per namespace). :mod:`.probe` is a
stand-alone tenant that attaches to a namespace and reports what it got.
"""

from dra_driver.mpsemu.paths import emulator_path

__all__ = ["emulator_path"]
