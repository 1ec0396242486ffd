"""Per-entity failover state machine, backlog rotation and backlog choice (SPEC B3, B4, B5, B8), one module per
job: :mod:`~spark_sb.failover.records` (states, transitions, statuses), :mod:`~spark_sb.failover.decisions` (the
pure decisions), :mod:`~spark_sb.failover.machine` (the entity state machine),
:mod:`~spark_sb.failover.namespace_health` (the namespace-wide evidence its entities share),
:mod:`~spark_sb.failover.rotation` (backlog rotation and choice), :mod:`~spark_sb.failover.registry` (the
process-level registry), :mod:`~spark_sb.failover.outcome` (what a send call did: outcomes, probe records,
the tally), :mod:`~spark_sb.failover.ordering` (order through failover: the rule that keeps a session's
messages in order, SPEC O1-O4). Each name is imported from the module that defines it.

States per destination entity (queue or topic) of the primary namespace::

    HEALTHY --fail_over-class error--> FAILING --failover_interval without a success--> FAILED_OVER
       ^                                  |                                                   |
       +------- successful send ----------+                 (probe every ping_primary_interval)
       +----------------------------------------- successful probe --------------------------+

* ``failover_interval == 0`` fails over on the first such failure.
* While FAILED_OVER, sends to the primary stop and a probe is due every ``ping_primary_interval``;
  a good probe returns the entity to HEALTHY at once.

Everything reads time through an injected :class:`~spark_sb.core.clock.Clock` (monotonic for timers, UTC wall time
for what is recorded). Decisions are small pure functions (:func:`failover_due`, :func:`probe_due`,
:func:`backoff_delay`, :func:`choose_random`, :func:`choose_session_affine`) tested directly.

State is shared per process (SPEC B4/B5: every sender in the executor process learns at once): the
:class:`FailoverRegistry` holds the entity states (keyed by primary namespace + entity) and the
:class:`BacklogRotation` (keyed by secondary namespace + queue). :func:`process_registry` is the process-level
one; tests inject a fresh registry.

Runs in executors' Python workers (one registry per worker process); thread-safe; the records
(:class:`StateTransition`, :class:`EntityStatus`, :class:`BacklogPull`) are small and picklable so that they
travel back to the driver in the send outcome.

Imports: core and message only; never the wire, Spark, state or admin.
"""
