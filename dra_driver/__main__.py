"""``python -m dra_driver`` runs the ``dra-driver`` command line."""

from dra_driver.app.cli import main

raise SystemExit(main())
