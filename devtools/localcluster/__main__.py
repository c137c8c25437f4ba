"""``python -m devtools.localcluster``: as hack/local-cluster."""

import sys

from devtools.localcluster.cli import main

sys.exit(main(sys.argv))
