"""Report: many run summaries -> scaling and comparison tables and plots; logs -> summaries."""
