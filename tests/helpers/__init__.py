"""What the tests share: tiny models and model files, processes and reward servers, the float64 references of the
operator tests, a headless Chromium, and the scripts run by path (the PyTorch sides of the reference checks, the
CUDA harness, the behaviour runs, the mutations)."""
