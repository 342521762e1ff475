"""`python -m fastdata ...`: the `fastdata` command."""

import sys

from .cli import main

sys.exit(main())
