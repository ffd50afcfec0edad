"""Adapters between the torch-only core and the frameworks: Lightning, NeMo configs, Hydra."""
