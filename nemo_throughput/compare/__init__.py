"""`nemo-throughput compare`: is a candidate slower than a baseline? sides (reading each side's
summaries, one configuration), stats (t quantiles, batch means, Welch's interval), comparison
(the change, its interval and the verdict), render (table and JSON), command (the subcommand)."""
