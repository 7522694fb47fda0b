"""Device telemetry in the run's timeline (issue 37): what the GPUs and the kernel said while the run trained.

    xid.py      the Xid numbers NVIDIA documents, what each means, and which are faults of the device
    kmsg.py     the kernel log, followed as it is written (/dev/kmsg, non-blocking): NVRM Xid lines, the OOM
                killer, hung tasks; parsed into device events
    nvml.py     one GPU read through NVML (nvidia-ml-py, imported lazily): clocks, temperature, power, memory,
                throttle reasons, ECC and row-remap counters; its Xid events through an NVML event set
    sampler.py  the probe's part: a thread per source, off the training thread, that records `device-sample`
                rows every few seconds and `device` events when something happened

NVML reads the driver, not the CUDA context: no host-device synchronisation, no kernel launched, nothing
the training waits for. Without NVML or a GPU, everything here is off, silently.
"""
