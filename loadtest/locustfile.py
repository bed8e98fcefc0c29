"""Locust entry point for the specbatch load tests; everything lives in specbatch.loadtest.

Run it through the runner (`python -m specbatch.loadtest --profile ...`), which starts a
server, passes the profile in $SPECBATCH_LOADTEST_PROFILE and the gRPC address in
$SPECBATCH_GRPC_HOST, and checks the SLA afterwards. Directly:

    SPECBATCH_LOADTEST_PROFILE=loadtest/profiles/smoke.yaml SPECBATCH_GRPC_HOST=localhost:8001 \\
        locust -f loadtest/locustfile.py --host http://localhost:8000
"""

from specbatch.loadtest.grpc_stream import enable_grpc_under_gevent
from specbatch.loadtest.users import (
    GrpcStreamUser,
    HttpGenerateUser,
    configure_user_classes,
    profile_from_environment,
)

enable_grpc_under_gevent()
configure_user_classes(profile_from_environment())

__all__ = ["GrpcStreamUser", "HttpGenerateUser"]
