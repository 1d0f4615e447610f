"""``python -m gpuperfd`` runs the CLI."""

import sys

from gpuperfd.cli import main

sys.exit(main())
