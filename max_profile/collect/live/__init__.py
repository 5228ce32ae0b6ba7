"""Live recorders of an in-process capture: the pipeline hook, CUPTI (C recorder and cupti-python), GPU sampling, host
load, NVTX / roctx markers and the NVTX log."""
