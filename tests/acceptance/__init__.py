"""The acceptance run: one scenario (healthy, a ``SendDisabled`` outage, recovery and syphon, fan-out) against two
local namespaces in CI and against the user's own Azure namespaces with ``make test-azure``.

Everything here runs on the driver (the test process or ``python -m tests.acceptance``); the sink's own tasks run
on the local Spark session's executors as in production.
"""
