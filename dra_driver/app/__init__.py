"""app: the command line and the long-running kubelet plugin that wire every layer.
May import: every layer."""
