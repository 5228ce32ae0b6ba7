"""Probes of the machine and the model: the environment (GPUs, tools), the model's files, and the start-up profile."""
