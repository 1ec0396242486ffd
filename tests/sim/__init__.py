"""The deterministic simulation of the ordering protocol and the ledger (SPEC O9, issue 47): tests/sim/world.py."""
