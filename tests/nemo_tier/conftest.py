"""The NeMo tier runs in .venv-nemo against real nemo_toolkit 2.5.0 (.ci/setup-nemo; .ci/test runs it)."""
