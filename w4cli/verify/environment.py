"""What the report says about the machine, and whether the GPU checks can run here."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

import torch

from w4cli import __version__


@dataclass
class Gpu:
    kernels: Any  # the w4cli.gpu.kernels module once its extension loaded, else None
    reason: str  # why the GPU checks are skipped ("" when they run)

    @property
    def usable(self) -> bool:
        return self.kernels is not None


def probe_gpu() -> Gpu:
    """What w4cli.gpu.kernels.probe() answers, as the checks take it."""
    from w4cli.gpu import kernels

    usable, reason = kernels.probe()
    return Gpu(kernels if usable else None, reason)


def describe(gpu: Gpu, seed: int | None) -> dict[str, Any]:
    name = None
    if torch.cuda.is_available():
        try:
            name = torch.cuda.get_device_name()
        except Exception:  # noqa: BLE001 - a broken driver still gets a report
            name = "unknown"
    env: dict[str, Any] = {
        "w4": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": name,
        "kernels": "loaded" if gpu.usable else f"unavailable: {gpu.reason}",
    }
    if seed is not None:
        env["seed"] = seed
    return env
