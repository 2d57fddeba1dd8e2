"""`python -m model.bench`: the speed targets (make bench)."""

import sys

from model.bench.suite import main

sys.exit(main())
