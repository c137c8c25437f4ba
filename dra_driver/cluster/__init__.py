"""cluster: what runs off the node, against the whole cluster: the ``dra-driver occupancy``
command (who holds which fraction of which GPU, and how much memory each uses), and the
cluster-wide objects the chart installs beside the node's slices (the DeviceClasses and the
sizing admission policies).
May import: model, infra, config.
"""
