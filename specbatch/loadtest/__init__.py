"""Locust load tests against SLA targets: profiles, users, the verdict, the latency plot, the runner.

`python -m specbatch.loadtest --profile loadtest/profiles/smoke.yaml --out DIR` runs one
profile end to end. Importing this package does not import Locust (which monkey-patches
the process with gevent); only `specbatch.loadtest.users`, loaded by the locustfile, does.
"""

from specbatch.loadtest.profiles import LoadProfile, ProfileError, load_profile
from specbatch.loadtest.sla import Verdict, evaluate, read_stats_csv, verdict_table

__all__ = [
    "LoadProfile",
    "ProfileError",
    "Verdict",
    "evaluate",
    "load_profile",
    "read_stats_csv",
    "verdict_table",
]
