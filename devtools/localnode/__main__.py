"""``python -m devtools.localnode``: as hack/local-node."""

import sys

from devtools.localnode.cli import main

sys.exit(main(sys.argv))
