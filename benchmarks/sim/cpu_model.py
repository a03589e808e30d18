"""How a training job's throughput depends on its CPU, for the resizer experiments.

The Pollux traces give a job's step time on a placement of GPUs; they say nothing about CPU.
This model is an ASSUMPTION, stated here and printed next to every figure that uses it:

- A step at the pod's reference CPU (what it requested at start, `c_ref`) takes the profiled
  time T. A fraction `f` of T is the CPU-bound input pipeline (decode, augmentation, feature
  extraction, collation) that the GPU waits on; the rest does not depend on CPU.
- The CPU part scales inversely with the cores the pipeline gets (data-parallel loader
  workers), Amdahl-style, up to `sat` x c_ref cores, beyond which more cores do not help
  (the loader has that many workers; the GPU is the bottleneck):

      speed(c) = 1 / ((1 - f) + f * c_ref / min(c, sat * c_ref))

  so speed(c_ref) = 1 exactly (default behaviour identical to the profiled traces), speed
  falls toward 0 as c -> 0, and saturates at 1 / ((1 - f) + f / sat).
- A job spread over several nodes runs at the speed of its slowest node (synchronous SGD).

Per-model f (fraction of the profiled step that waits on CPU at the reference allocation) are
our estimates from what each model's input pipeline does, not measurements:
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class CpuSensitivity:
    cpu_fraction: float  # f
    saturation: float = 3.0  # sat: more than sat x c_ref cores does not help
    why: str = ""


# Assumptions (see the module docstring); printed by benchmarks/run_flowcon.py.
DEFAULT_SENSITIVITY: Mapping[str, CpuSensitivity] = {
    "cifar10": CpuSensitivity(0.45, why="ResNet-18 on 32x32 images: tiny GPU work per image, random crop/flip on CPU"),
    "imagenet": CpuSensitivity(0.35, why="ResNet-50: JPEG decode + random-resized-crop on CPU"),
    "yolov3": CpuSensitivity(0.30, why="image decode, letterbox and augmentation on CPU"),
    "deepspeech2": CpuSensitivity(0.25, why="spectrogram features computed on CPU"),
    "ncf": CpuSensitivity(0.10, why="integer ids only; embedding lookups run on the GPU"),
    "bert": CpuSensitivity(0.05, why="pre-tokenised text; collation only"),
}
UNKNOWN_MODEL = CpuSensitivity(0.2, why="models not listed")


def cpu_speed(cpu_m: npt.ArrayLike, ref_m: npt.ArrayLike, fraction: npt.ArrayLike,
              saturation: npt.ArrayLike = 3.0) -> FloatArray:
    """Throughput relative to the profiled one at cpu_m millicores (vectorised)."""
    c = np.asarray(cpu_m, dtype=np.float64)
    ref = np.asarray(ref_m, dtype=np.float64)
    f = np.asarray(fraction, dtype=np.float64)
    eff = np.minimum(c, np.asarray(saturation, dtype=np.float64) * ref)
    with np.errstate(divide="ignore"):
        out = 1.0 / ((1.0 - f) + f * ref / np.maximum(eff, 1e-9))
    return np.asarray(out, dtype=np.float64)


def sensitivity_of(app: str, table: Mapping[str, CpuSensitivity] = DEFAULT_SENSITIVITY) -> CpuSensitivity:
    return table.get(app, UNKNOWN_MODEL)


def describe(table: Mapping[str, CpuSensitivity] = DEFAULT_SENSITIVITY) -> str:
    lines = ["CPU-sensitivity model (assumed, benchmarks/sim/cpu_model.py): "
             "speed(c) = 1 / ((1-f) + f * c_ref / min(c, sat * c_ref)), c_ref = the pod's starting request"]
    for name, s in {**table, "(other)": UNKNOWN_MODEL}.items():
        top = float(cpu_speed(s.saturation, 1.0, s.cpu_fraction, s.saturation))
        half = float(cpu_speed(0.5, 1.0, s.cpu_fraction, s.saturation))
        lines.append(f"  {name:<12} f={s.cpu_fraction:.2f} sat={s.saturation:g}x  "
                     f"speed at 0.5x c_ref {half:.2f}, max {top:.2f}  ({s.why})")
    return "\n".join(lines)
