"""The plugin's handle on a control daemon that the MPS node service runs: ready when the
service's readiness file says so and the daemon answers; never started or stopped by the plugin.
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.enforce.mps.daemon import MpsDaemon
from dra_driver.enforce.mpsservice.readiness import ReadinessError, read_state, state_path
from dra_driver.enforce.rules.base import MpsError
from dra_driver.enforce.rules.rows import ServerRow


class ServiceDaemon(MpsDaemon):
    """A control daemon the MPS node service runs (:mod:`dra_driver.enforce.mpsservice.service`):
    the plugin is its client only. It never starts or stops the daemon; :meth:`ensure_running`
    checks that the service says the daemon is ready
    (:mod:`dra_driver.enforce.mpsservice.readiness`) and that it answers.

    Args: as :class:`MpsDaemon`.
    """

    @property
    def state_file(self) -> Path:
        """The service's readiness file (``<root>/service.json``)."""
        return state_path(self.dir.parent)

    def service_problem(self) -> str | None:
        """Why the service cannot serve this daemon's mode now, or None."""
        try:
            state = read_state(self.state_file)
        except ReadinessError as exc:
            return f"no MPS service on this node ({exc})"
        if not state.service_alive():
            return f"the MPS service (pid {state.pid}) is not running"
        return state.problem(self.mode)

    def ensure_running(self) -> bool:
        """Check that the service runs this mode's daemon and it answers; never starts one.

        Raises:
            MpsTimeout: the daemon runs but does not answer in time.
            MpsError: the service is not ready (the message says why and names the DaemonSet
                that runs it).
        """
        self.ensure_answering()
        return False

    def ensure_answering(self) -> list[ServerRow]:
        """:meth:`ensure_running`, returning the ``server list`` that showed the daemon answers.

        Raises:
            MpsTimeout: the daemon runs but does not answer in time.
            MpsError: the service is not ready (the message says why and names the DaemonSet
                that runs it).
        """
        problem = self.service_problem()
        rows = self._rows() if problem is None else None
        if problem is None and rows is None:
            problem = f"the {self.mode} control daemon does not answer at {self.pipe_dir}"
        if problem is not None or rows is None:
            raise MpsError(
                f"MPS service not ready on this node: {problem}. The MPS node service (the "
                "gpu-fraction-dra-mps DaemonSet, dra-driver mps-service) runs the control "
                "daemons; claims that need MPS fail until it is back"
            )
        return rows

    def stop(self, only_idle: bool = False) -> None:
        """Nothing: the service owns the daemon (it keeps running for the next claims)."""
