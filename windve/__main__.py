"""`python -m windve ...`, the same as the `windve` command (for an environment without its script)."""

import sys

from windve.cli import main

sys.exit(main())
