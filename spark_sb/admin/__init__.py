"""The operator's tools: provisioning the backlog queues, the status report, the dashboard's data and the
``spark-sb`` command line (SPEC B1, B14, S4).

* :mod:`~spark_sb.admin.provisioning` - creating and checking the backlog queues;
* :mod:`~spark_sb.admin.report` - what provisioning found;
* :mod:`~spark_sb.admin.status` - the state tables and backlog depths, summarised;
* :mod:`~spark_sb.admin.horizon` - the primary entities' duplicate detection against ``exactly_once_horizon``;
* :mod:`~spark_sb.admin.dashboard` - the failover dashboard's data;
* :mod:`~spark_sb.admin.cli` - ``spark-sb`` / ``python -m spark_sb``.

Runs on the driver or in a terminal; never on executors. Imports anything below it; nothing imports it but the
top-level API.
"""
