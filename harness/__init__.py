"""What the tests and the benchmarks both drive, in one place that is neither's own folder: outage shapes against
two local namespaces (:mod:`harness.outages`) and the state tables' growth over many batches
(:mod:`harness.state_growth`). Not part of any distribution; imported from the repository root (pytest's rootdir,
and ``bench/`` scripts add the root to ``sys.path``)."""
