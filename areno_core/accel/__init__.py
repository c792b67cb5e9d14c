"""What makes a run fast and fit on its device: precision (``--dtype``), attention kernels
(``--attn-backend``), and memory measurement and hand-off between rollout and training.

Each module has one job and works on a CPU too (where the GPU paths fall back), so its logic
is tested without a GPU:

* :mod:`areno_core.accel.precision`: the dtype a run's models are loaded in;
* :mod:`areno_core.accel.attention`: flash-attn or torch SDPA, with the fallback warning, and
  packed (padding-free) training rows for flash-attn;
* :mod:`areno_core.accel.memory`: peak memory of a phase (device memory on a GPU, process
  memory on a CPU) and moving optimizer state off the device during rollout.
"""
