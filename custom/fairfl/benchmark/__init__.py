"""`fairfl benchmark TASK`: every method the papers compare, side by side on one task's data (see
fairfl.benchmark.command).

runner: the runs and the outputs; run_statistics: what the outputs say of the runs; checks: arms that did not train
and sites FedAvg leaves untrained; claims: the papers' claims judged on the runs and their table; summary:
SUMMARY.md; rejudge: the claims judged again from the outputs; command: the command line."""
