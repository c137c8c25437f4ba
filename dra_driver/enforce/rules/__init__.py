"""enforce.rules (pure): what MPS enforcement decides, with no command run and no file touched: a
claim's per-GPU targets, the CDI containerEdits and hooks they give, MPS object names and the
rows ``nvidia-cuda-mps-control`` lists, the claims declared to a daemon, the client cap, outages.
May import: model.
"""
