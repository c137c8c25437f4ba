"""enforce.mpsservice: the MPS node service, a program of its own (``dra-driver mps-service``,
its own DaemonSet) that runs the node's control daemons outside the plugin's life; its readiness
file; and :class:`~dra_driver.enforce.mpsservice.servicedaemon.ServiceDaemon`, the plugin's handle
on a daemon the service runs.
May import: model, infra, enforce.rules, enforce.mps.
"""
