"""``python -m devtools.buildimage``: as hack/build-image."""

import sys

from devtools.buildimage.cli import interrupt_on_sigterm, main

interrupt_on_sigterm()
sys.exit(main(sys.argv[1:]))
