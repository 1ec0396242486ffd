"""The configuration (SPEC S8): one frozen, validated, picklable object and everything that reads it.

* :mod:`~spark_sb.config.service_bus` - :class:`~spark_sb.config.service_bus.ServiceBusConfig` and
  :func:`~spark_sb.config.service_bus.load_config`;
* :mod:`~spark_sb.config.settings` - the settings table: every key, its parser and its check;
* :mod:`~spark_sb.config.loading` - YAML, option maps and environment into keyword arguments;
* :mod:`~spark_sb.config.namespace` - a namespace's part (endpoint, credential, retries);
* :mod:`~spark_sb.config.endpoints` - connection strings and hosts; :mod:`~spark_sb.config.secret` - secrets;
* :mod:`~spark_sb.config.clients` - building SDK clients from a namespace's settings.

Runs on the driver (or in a plain process), where a configuration is loaded; shipped to executors by pickling. Imports: core, message (the row
columns and backlog rules that some keys name).
"""
