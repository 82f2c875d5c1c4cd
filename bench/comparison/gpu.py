"""The GPU's identity, SM clock and board power: NVML (nvidia-ml-py) where installed, else
nvidia-smi (no power)."""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional

import torch

SAMPLE_PERIOD_S = 0.01


def _bus_id() -> Optional[str]:
    """The current device's PCI bus id (NVML numbers devices without CUDA_VISIBLE_DEVICES)."""
    try:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    except (AttributeError, RuntimeError):
        return None


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(_bus_id())
        except Exception:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return pynvml, handle
    except Exception:  # no nvidia-ml-py, or NVML not usable: nvidia-smi below
        return None, None


_PYNVML, _HANDLE = None, None


def _init() -> None:
    global _PYNVML, _HANDLE
    if _PYNVML is None:
        _PYNVML, _HANDLE = _nvml()


def _smi(field: str) -> Optional[str]:
    bus = _bus_id()
    try:
        text = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"] + (["-i", bus] if bus else []),
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        return text.splitlines()[0].strip() if text else None
    except Exception:
        return None


def sm_clock_mhz() -> Optional[float]:
    """The SM clock now (MHz)."""
    _init()
    if _PYNVML is not None:
        return float(_PYNVML.nvmlDeviceGetClockInfo(_HANDLE, _PYNVML.NVML_CLOCK_SM))
    value = _smi("clocks.sm")
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _energy_mj() -> Optional[int]:
    """The board's energy counter (mJ since the driver loaded); None where NVML lacks it."""
    try:
        return int(_PYNVML.nvmlDeviceGetTotalEnergyConsumption(_HANDLE))
    except Exception:  # NVMLError_NotSupported and the like: no power figure
        return None


class ClockSampler:
    """Samples the SM clock every 10 ms on a thread while a timed run goes on, and reads the
    board's energy counter before and after it (NVML only: nvidia-smi is too slow to sample);
    `median` (MHz) and `watts` (the run's mean board power) are None without NVML. Under
    sustained load the clock follows the power limit: of two kernels doing the same work, the
    one that draws more power runs at the lower clock, which the time alone does not show."""

    def __init__(self) -> None:
        _init()
        self.samples: List[float] = []
        self.watts: Optional[float] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True) if _PYNVML is not None else None
        self._start: Optional[tuple] = None

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.samples.append(float(_PYNVML.nvmlDeviceGetClockInfo(_HANDLE, _PYNVML.NVML_CLOCK_SM)))
            self._stop.wait(SAMPLE_PERIOD_S)

    def __enter__(self) -> "ClockSampler":
        if self._thread is not None:
            energy = _energy_mj()
            self._start = (energy, time.perf_counter()) if energy is not None else None
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if self._start is not None:
                energy, seconds = _energy_mj(), time.perf_counter() - self._start[1]
                if energy is not None and seconds > 0:
                    self.watts = (energy - self._start[0]) * 1e-3 / seconds

    @property
    def median(self) -> Optional[float]:
        return statistics.median(self.samples) if self.samples else None


def identity() -> Dict[str, Any]:
    """GPU name, driver, SM count, maximum SM clock, library versions."""
    _init()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    driver, max_sm = None, None
    if _PYNVML is not None:
        driver = _PYNVML.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        max_sm = float(_PYNVML.nvmlDeviceGetMaxClockInfo(_HANDLE, _PYNVML.NVML_CLOCK_SM))
    else:
        driver = _smi("driver_version")
        max_clock = _smi("clocks.max.sm")
        max_sm = float(max_clock) if max_clock and max_clock.replace(".", "").isdigit() else None
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return dict(
        gpu=props.name,
        sms=props.multi_processor_count,
        driver=driver,
        max_sm_mhz=max_sm,
        cuda=torch.version.cuda,
        torch=torch.__version__,
        triton=triton_version,
        clock_source="nvml" if _PYNVML is not None else "nvidia-smi",
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
