"""How fast the GPU ran while a load ran.

A phase or cell can run slower because the GPU's clocks are lower (a power or thermal limit
after a heavy load) rather than because of anything the engine does; throughput alone cannot
tell the two apart. Each cell and phase therefore records the GPU's SM clock, power draw and
temperature over its run, and the reasons the driver gave for holding the clocks down,
sampled through NVML (the driver's own library, read with ctypes: nothing to install). Only
the first visible GPU is sampled. Where NVML is missing (no NVIDIA driver) nothing is
recorded.
"""

from __future__ import annotations

import ctypes
import functools
import os
import statistics
import threading

INTERVAL_S = 0.1
JOIN_S = 1.0
LIBRARY = "libnvidia-ml.so.1"
# nvmlClocksEventReasons bits (nvml.h), by the names the results print.
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
_NVML_CLOCK_SM = 1
_NVML_TEMPERATURE_GPU = 0


def first_visible_gpu() -> str:
    """The GPU the bench's engines run on: the first of CUDA_VISIBLE_DEVICES (an index or a
    UUID), else 0. An index is read in NVML's order (PCI bus), which is CUDA's too where
    CUDA_DEVICE_ORDER=PCI_BUS_ID or the GPUs are all of one model."""
    return (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"


@functools.cache
def nvml_reader(gpu: str | None = None, library: str = LIBRARY):
    """A function returning one sample (SM MHz, power W, temperature C, reason bits) of `gpu`
    per call, or None where NVML cannot be loaded or does not know the GPU. Loaded once per
    process and GPU."""
    try:
        nvml = ctypes.CDLL(library)
        if nvml.nvmlInit_v2() != 0:
            return None
        gpu = gpu or first_visible_gpu()
        handle = ctypes.c_void_p()
        if gpu.isdigit():
            rc = nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(gpu)), ctypes.byref(handle))
        else:
            rc = nvml.nvmlDeviceGetHandleByUUID(gpu.encode(), ctypes.byref(handle))
        if rc != 0:
            return None
        reasons_of = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
    except Exception:  # noqa: BLE001 - a clock reading must never fail a measurement
        return None

    def read():
        mhz, mw, temp, bits = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        if nvml.nvmlDeviceGetClockInfo(handle, _NVML_CLOCK_SM, ctypes.byref(mhz)) != 0:
            return None
        power = mw.value / 1000 if nvml.nvmlDeviceGetPowerUsage(handle, ctypes.byref(mw)) == 0 else None
        temp_c = (
            temp.value
            if nvml.nvmlDeviceGetTemperature(handle, _NVML_TEMPERATURE_GPU, ctypes.byref(temp)) == 0
            else None
        )
        reason_bits = bits.value if reasons_of(handle, ctypes.byref(bits)) == 0 else 0
        return mhz.value, power, temp_c, reason_bits

    return read


def summarize(samples: list[tuple]) -> dict:
    """A load's record from its samples: mean and lowest SM clock, mean power, highest
    temperature, and every reason the driver gave for holding the clocks (gpu_idle left out:
    a load's waves have idle gaps); {} without samples."""
    if not samples:
        return {}
    bits = 0
    for s in samples:
        bits |= s[3]
    powers = [s[1] for s in samples if s[1] is not None]
    temps = [s[2] for s in samples if s[2] is not None]
    return {
        "gpu_sm_mhz": statistics.fmean(s[0] for s in samples),
        "gpu_sm_mhz_min": min(s[0] for s in samples),
        "gpu_power_w": statistics.fmean(powers) if powers else None,
        "gpu_temp_c": max(temps) if temps else None,
        "gpu_clock_reasons": [name for bit, name in REASONS.items() if bits & bit and name != "gpu_idle"],
    }


class Sampler:
    """Samples the GPU every `interval_s` on a thread of its own between start() and stop();
    stop() returns summarize() of the samples. `read` (one sample per call, None to skip) is
    NVML's by default; without NVML the sampler records nothing, and a read that raises ends
    the sampling with the samples taken, never the load."""

    def __init__(self, read=None, interval_s: float = INTERVAL_S):
        self._read = read if read is not None else nvml_reader()
        self._interval = interval_s
        self._samples: list[tuple] = []
        self._stop = threading.Event()
        self._thread = None

    def _run(self):
        while True:
            try:
                sample = self._read()
            except Exception:  # noqa: BLE001 - a clock reading must never fail a measurement
                return
            if sample is not None:
                self._samples.append(sample)
            if self._stop.wait(self._interval):
                return

    def start(self) -> Sampler:
        if self._read is not None:
            self._thread = threading.Thread(target=self._run, name="gpuclock", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> dict:
        """The samples so far, reduced; a read still blocked in the driver after JOIN_S is
        left to finish on its own (the thread is a daemon) rather than hold up the load."""
        if self._thread is None:
            return {}
        self._stop.set()
        self._thread.join(JOIN_S)
        return summarize(list(self._samples))
