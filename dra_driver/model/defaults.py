"""Default values of the plugin's flags that the command line shows, kept here (constants only)
so that parsing the command line imports no client library: ``dra-driver mps-service`` then
starts without loading gRPC, the Kubernetes client or Prometheus (measured: about 45 MiB
less resident memory). The modules that use them import them from here."""

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/plugins"
"""The kubelet's DRA plugin directory (``--plugin-dir``)."""
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
"""The kubelet's plugin registration directory (``--registry-dir``)."""

REGISTRATION_TIMEOUT_S = 60.0
"""Seconds without a ``GetInfo`` after the socket was created before the plugin reports it."""

FIRST_SWEEP_AFTER_S = 60.0
"""Seconds after start before the first sweep: the kubelet re-sends the Unprepare calls it still
owes a restarted plugin within this time, and those need no sweep."""
SWEEP_INTERVAL_S = 600.0
"""Seconds between two sweeps that found no orphan (``--orphan-sweep-interval``)."""

USAGE_INTERVAL_S = 15.0
"""Default seconds between usage samples (NVML and ``client list`` at most this often)."""

PLUGIN_SELECTOR = "app.kubernetes.io/component=kubelet-plugin"
"""Label selector of the kubelet plugin pods (the chart's DaemonSet labels them so)."""
