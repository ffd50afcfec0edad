"""Goodput: where a job's wall-clock time went, across its restarts. ledger (a segment's ledger on the
hot path, the run's segments stitched), segments (which run a segment continues), run (rank 0's view:
the ledger, the run it continues, goodput.json)."""
