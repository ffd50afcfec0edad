"""Readers of the logs of runs made without the plugin (NeMo, Megatron-LM, TensorBoard), into summaries."""
