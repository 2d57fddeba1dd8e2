"""`python -m model.bench.suite`: the speed targets (make bench)."""

import sys

from model.bench.suite.suite import main

sys.exit(main())
