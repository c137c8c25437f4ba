"""``python -m devtools.demo``: as hack/demo."""

import sys

from devtools.demo.cli import main

sys.exit(main())
