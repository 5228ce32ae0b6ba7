"""File readers: other profilers' outputs (nsys, rocprofv3, Kineto, Nsight Compute) and the format registry, each into
a RawCapture."""
