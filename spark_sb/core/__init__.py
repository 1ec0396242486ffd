"""The ground floor: what every wing may use and that imports nothing of the others.

* :mod:`~spark_sb.core.clock` - injected time (monotonic timers, UTC wall time, the fake clock of tests);
* :mod:`~spark_sb.core.errors` - the error taxonomy (:func:`~spark_sb.core.errors.classify`), the exceptions the
  library raises and the one secret-free :func:`~spark_sb.core.errors.describe_error`;
* :mod:`~spark_sb.core.redact` - removing registered secrets from any text;
* :mod:`~spark_sb.core.durations` - durations of the configuration and ISO-8601;
* :mod:`~spark_sb.core.counts` - merging per-key counts;
* :mod:`~spark_sb.core.hosts` - a namespace's host as written, split into name and port;
* :mod:`~spark_sb.core.sdk_types` - the SDK types the per-message hot paths look up once;
* :mod:`~spark_sb.core.lazy` - classes built on first use (the data source's, which subclass pyspark's).

Runs anywhere (driver, executors' Python workers, plain processes); pure and picklable. Imports: the standard
library and the SDK only.
"""
