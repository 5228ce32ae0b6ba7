"""The server side of `max serve` captures: the load client, /metrics, the serve recorders and profiler drivers, and
the model-worker hook."""
