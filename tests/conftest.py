import os

from hypothesis import HealthCheck, settings

import lucid._dispatch

# Every kernel's output is checked against its op's shape/dtype inference during the tests.
lucid._dispatch.CHECK_INFERENCE = True

settings.register_profile(
    "lucid",
    deadline=None,
    max_examples=int(os.environ.get("LUCID_HYPOTHESIS_EXAMPLES", "25")),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("lucid")
