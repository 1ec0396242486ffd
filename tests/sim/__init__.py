"""The deterministic simulation of the ordering protocol and the ledger (SPEC O9, issue 47): tests/sim/world.py
drives the real sender, sink driver, syphon and syphon job over tests/sim/backlog.py's queues on one fake clock;
tests/sim/test_simulation.py runs the schedules (``SIM_SCHEDULES``, ``SIM_SEED``; ``make simulate N=...``).

What it found (each break put back alone in a copy of the tree, the rest of HEAD as of 4629fdb; schedules run from
seed 0 until a property failed that HEAD's run of the same seed does not fail):

| break put back                                            | property      | schedules | SIM_SEED |
| item 1: the syphon job's txn id per namespace (b3cb2f9)   | O5, O3        | 6         | 5        |
| item 2: a mid-call failover reorders a session (4c4237a)  | O1            | 165       | 164      |
| item 3: spark_sb/syphon as at ce9de6a (head locked)       | O1            | 87        | 86       |
| item 6: the same (a held line churns)                     | O7            | 201       | 200      |
| item 4: a held line's pulled queue not tried (a50db73)    | O8            | 6         | 5        |
| restore_book hands the tasks no held line                 | O1, O3        | 6         | 5        |
| the sink never writes the sessions table                  | O1            | 6         | 5        |
| the acknowledgements read without ACK_SKEW                | O3            | 47        | 46       |

Not found in 3,000 schedules (equivalent here: setting (a) never acknowledges in a task's book, and a line has one
pending marker per queue): ``Held.drained`` ignoring ``sending``; the ledger releasing a line on any one
acknowledged marker. Found on HEAD itself, then fixed: O7 / O1-dlq / liveness-dlq - a probe-answering entity whose
sends fail had each held head abandoned after every pass's attempt until MaxDeliveryCount 10 dead-lettered it
(seeds 57, 139, ...: 10 of 600; with the O7 check of abandoned attempts, 118 of seeds 0-999, the first at 18).
"""
