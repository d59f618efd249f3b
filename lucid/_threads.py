"""Lucid's BLAS threading policy, applied before numpy or the native module load a BLAS.

Two OpenBLAS thread pools live in one Lucid process: numpy's (eager kernels) and the native
runtime's (compiled matmul and convolution). By default an idle OpenBLAS worker keeps spinning
for a while after each call; with both pools spinning on a 2-core machine, alternating eager and
compiled work slowed matmuls 10-40x. Idle workers therefore go to sleep at once
(``OPENBLAS_THREAD_TIMEOUT=1``) unless the user set the variable. numpy honours it only when Lucid
is imported before numpy; the native pool always does. ``LUCID_NUM_THREADS`` sets the native
pool's size (see ``lucid.backends.cpu.set_num_threads``).
"""

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "1")
