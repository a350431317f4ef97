"""Runner preflight: can this machine run the GPU tiers, and what does it measure? And, once a tier has run on it,
was a failure the build's or the runner's?

    moegate preflight [--json FILE] [--checks driver,gpu,disk] [--model DIR]... [--need-pinned-gib G]
                      [--leg kernels|e2e|ab]... [--need-disk-gib G] [--disk-path DIR] [--uva-gib G]

The first step of every GPU leg (``tooling/ci/gpu_leg.py preflight``; ``--checks driver,disk`` before the leg's
environments are built, with any Python: no torch needed). Each check prints one line (``ok``, ``FAIL`` or ``info``)
and the run exits 0 only when every check passed; a failing check's line names the cause. A GPU the preflight cannot
see (no driver, or torch sees none) is one line and exit 2, before any other check: nothing below can run there.
``--json`` writes the whole report (the contract the A/B reads: ``uva_read_gbps`` feeds its evidence columns
instead of a constant).

The modules, one job each:

- ``report.py``: a check's line and the report (``--json``);
- ``checks.py``: **driver** (``nvidia-smi`` lists a GPU: no torch, so it runs before any environment is built),
  **gpu** (a CUDA device torch can use, its name and memory), **gpu-memory** (free GPU memory against what the
  legs need, ``needs.py``), **shared** (other processes holding GPU memory: information, they share the bus),
  **disk** (free space where the environments live: two vLLM environments of about 9.4 GB each,
  ``results/environments.md``, the models and the runs' files: 30 GiB);
- ``host.py``: **uva** (the read bandwidth of a CUDA view of pinned host memory, the way UVA offloading reads expert
  weights in place; the median of ``--repeats`` reads of ``--uva-gib`` GiB after one untimed read; the H200's PCIe
  5.0 x16 read 51 GB/s, a PCIe 4.0 x16 card about half) and **pinned** (that the host can pin what the offloading
  tiers will pin: checked against ``MemAvailable`` first, so an impossible request fails without touching memory,
  then by pinning it in 1-GiB pieces, released at once);
- ``pcie.py``: **pcie**, the link generation and width as the driver reports them (NVML, else ``nvidia-smi``,
  else sysfs), read *after* the bandwidth measurement: an idle link trains down to generation 1 to save power.
  Information, not a gate;
- ``needs.py``: what the legs need: pinned host memory (twice each served model's expert bytes, ``--model``) and
  free GPU memory per leg (``--leg``), each figure derived in its docstring;
- ``gpu_processes.py``: the one question to NVML the runner-fault verdict asks (which processes hold memory on
  this GPU, and which of them are not the tier's own), and a watch that asks it while a tier runs;
- ``attempts.py``: one run of a tier with its output kept and its GPU watched, classified by
  ``moegate.core.faults`` (FAIL, PASS or RUNNER FAULT) and retried once on a runner fault: ``moegate gate`` and
  the GPU legs (``tooling/ci/gpu_leg.py``) run their tiers through it;
- ``cli.py``: ``moegate preflight`` itself.
"""
