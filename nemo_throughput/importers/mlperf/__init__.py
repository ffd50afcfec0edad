"""MLPerf Training result files (``:::MLLOG {json}`` lines) as imported summaries (``import --format
mlperf``), one module per concern:

- tree: the result files to import, found in the files and folders given;
- systems: ``<submitter>/systems/<system>.json``, and the one check of every stated count;
- result_log: one result file read with mlperf-logging's parser and judged by its compliance checker;
- result_summary: the summary of one result: time to train, counts, samples/s and notes.

Here: the names import's command uses.
"""

from nemo_throughput.importers.mlperf.result_summary import NAME, import_result, note_byte_copies, unnamed_round_note
from nemo_throughput.importers.mlperf.systems import MAX_COUNT, plausible_count
from nemo_throughput.importers.mlperf.tree import NotAResultFile, result_files

__all__ = ["MAX_COUNT", "NAME", "NotAResultFile", "import_result", "note_byte_copies", "plausible_count",
           "result_files", "unnamed_round_note"]
