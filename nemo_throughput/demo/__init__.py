"""The demo: a small NeMo-shaped GPT pretraining script (``python -m nemo_throughput.demo.train``)."""
