//! kgen-runtime: loads PTX through the CUDA driver and launches it.
