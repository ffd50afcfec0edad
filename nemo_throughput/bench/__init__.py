"""`nemo-throughput bench`: what the callback costs and how right it measures, beside the tools users
would otherwise use, in one run.

The demo GPT trains for a fixed number of steps under each condition, conditions interleaved
(A B C A B C ...) for several rounds. Every trial carries the same harness callback, which reads
a synchronized wall clock at the end of the step before the window (`--window`, report's syntax)
and at the end of its last step: the elapsed time over the window's step count is the true step
time. Per condition: the median true step time over rounds, its
overhead against no callback (the median, and the mean of the per-round ratios with a 95 %
confidence interval: rounds are paired, since each round runs every condition once), and the
step time the condition's own tool reported over the same steps, with its error against the true
one; the time its hooks take per step on the host. On CUDA one more round, untimed, counts the
host-device synchronizations per step, in the whole step and in the tool's own hooks
(:class:`SyncCounter`).

Modules: :mod:`.trials` runs the conditions, with :mod:`.harness` (the clock and hook timers each trial
carries) and :mod:`.syncs` (the synchronization counter); :mod:`.stats` turns rounds into overheads and
confidence intervals; :mod:`.render` prints them; :mod:`.command` is `nemo-throughput bench`;
:mod:`.log_step` is `bench --ranks`.
"""
