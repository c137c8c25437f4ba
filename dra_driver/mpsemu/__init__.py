"""An emulator of NVIDIA MPS for nodes without GPUs: the control daemon's semantics as a state
machine (:mod:`.state`), shared by the in-process test fake and the emulator program that real
processes talk to."""
