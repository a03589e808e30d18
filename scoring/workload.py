"""Workload classes: training, inference, notebook (`flowsched.io/workload`).

Explicit when the pod says so (annotation or label); otherwise from the kind of the pod's
controlling owner: a Deployment's or ReplicaSet's pods serve (inference), a StatefulSet's or a
Kubeflow Notebook's pods are interactive (notebook), Job-like owners train. A pod with no
owner trains, as flowsched has always treated pods.

What a class changes:
- inference spreads (no GPU best fit), never goes where a GPU it may land on is busier than
  `inference_util_pct` (strict shared-GPU rule, scoring/sharing.py), and is never chosen by
  flowsched's migrator, elastic optimizer or preemption candidates;
- notebook and training are placed as before; a notebook may be reclaimed when idle only with
  its own opt-in (`flowsched.io/reclaim-idle`).
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from scoring.placement import PlacementSettings


class WorkloadClass(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    NOTEBOOK = "notebook"


OWNER_DEFAULTS = {
    "Deployment": WorkloadClass.INFERENCE,
    "ReplicaSet": WorkloadClass.INFERENCE,
    "StatefulSet": WorkloadClass.NOTEBOOK,
    "Notebook": WorkloadClass.NOTEBOOK,
    "Job": WorkloadClass.TRAINING,
    "CronJob": WorkloadClass.TRAINING,
    "PyTorchJob": WorkloadClass.TRAINING,
    "TFJob": WorkloadClass.TRAINING,
    "MPIJob": WorkloadClass.TRAINING,
    "XGBoostJob": WorkloadClass.TRAINING,
    "PaddleJob": WorkloadClass.TRAINING,
    "JAXJob": WorkloadClass.TRAINING,
    "TrainJob": WorkloadClass.TRAINING,
}


def workload_class(explicit: str | None, owner_kind: str) -> WorkloadClass:
    """The pod's class: its own `flowsched.io/workload` when valid, else its owner's default.
    An unknown explicit value falls back to the owner default (never an error on the hot path)."""
    if explicit:
        try:
            return WorkloadClass(explicit.strip().lower())
        except ValueError:
            pass
    return OWNER_DEFAULTS.get(owner_kind, WorkloadClass.TRAINING)


def never_a_victim(cls: str) -> bool:
    return cls == WorkloadClass.INFERENCE


def placement_for(settings: PlacementSettings, cls: str) -> PlacementSettings:
    """The placement settings for a pod of this class."""
    if cls != WorkloadClass.INFERENCE:
        return settings
    return replace(settings, pack_gpus=False,
                   saturation_util_pct=min(settings.saturation_util_pct, settings.inference_util_pct))
