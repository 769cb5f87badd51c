"""`python -m inferchain.cli ...`: the same as the `inferchain` command."""

import sys

from inferchain.cli import main

sys.exit(main())
