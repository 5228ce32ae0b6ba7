"""Collection: everything that reads or records, each returning the model's records (a ``RawCapture``), never analysing.

* ``readers/`` — other profilers' files (nsys, rocprofv3, Kineto, Nsight Compute) and the format registry (``sources``).
* ``live/`` — recorders of an in-process capture: the pipeline hook, CUPTI, GPU sampling, host load, markers, the NVTX
log.
* ``server/`` — ``max serve`` captures: the load client, /metrics, serve recorders and profiler drivers, the worker
hook.
* ``probes/`` — the machine and the model: environment, model files, the start-up profile.
"""
