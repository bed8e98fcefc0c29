"""`python -m specbatch.loadtest --profile loadtest/profiles/smoke.yaml --out results/loadtest`."""

import sys

from specbatch.loadtest.runner import main

sys.exit(main())
