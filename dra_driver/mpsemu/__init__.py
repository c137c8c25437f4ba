"""mpsemu (simulation): an emulator of NVIDIA MPS for nodes without GPUs (run as
``nvidia-cuda-mps-control`` and ``nvidia-cuda-mps-server``), and the tenant probe.
May import: model.

The control daemon's semantics are one state machine (:mod:`.state`, records in :mod:`.model`),
shared by the in-process test fake (``tests/support/fakes/mps_control.py``, plain files) and
the emulator program real processes talk to (:mod:`.processes`, real sockets and processes).

Use: run :func:`.paths.emulator_path` where the driver runs ``nvidia-cuda-mps-control`` (e.g.
``MpsOptions(control_binary=str(emulator_path()))``, or ``MpsDaemon(..., binary=...)``), with
the usual ``CUDA_MPS_PIPE_DIRECTORY``/``CUDA_MPS_LOG_DIRECTORY``/``CUDA_MPS_PROTOCOL_VERSION``:

- ``nvidia-cuda-mps-control -p 3 -m -d`` starts a daemon (:mod:`.daemon`) listening on
  ``<pipe>/control`` (:mod:`.wire`), PID in ``<pipe>/nvidia-cuda-mps-control.pid``, log in
  ``<log>/control.log``; ``-f`` runs it in the foreground (commands on stdin too), ``-q``
  stops it; other invocations are commands sent to it (:mod:`.cli`);
- ``server create`` starts an ``nvidia-cuda-mps-server`` process (:mod:`.server`) with a
  socket per namespace (so does each server the ``-a`` file declares, at the daemon's start,
  :mod:`.config`); ``MPS_EMULATOR_VISIBLE_GPUS`` (comma-separated UUIDs; unset: all)
  says which GPUs servers can open;
- ``python3 probe.py`` (:mod:`.probe`, standard library only) is a tenant: with
  ``CUDA_MPS_PIPE_DIRECTORY`` at a namespace directory it attaches and reports its limits.

The programs are files in ``bin/``, not console scripts, so that nothing named like NVIDIA's
programs lands on ``PATH``. The driver runs the control program once per MPS command, so the
``nvidia-cuda-mps-control`` it runs is compiled (``control_client.c``, built by
:func:`.paths.emulator_path`) and starts as fast as NVIDIA's: it sends plain commands itself
and hands the rest (``-d``, ``-f``, ``-q``, ``-h``, help) to the Python program
``bin/nvidia-cuda-mps-control-py`` (:mod:`.cli`). The package imports nothing itself.
"""
