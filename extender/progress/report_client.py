"""The training-side client, kept importable here for scripts written against this path: it
lives in the standalone, standard-library-only package flowsched_client (docs/progress-api.md)."""

from flowsched_client import (
    IN_CLUSTER_URL,
    SA_DIR,
    Reporter,
    ReporterConfig,
    Sender,
    gradient_noise,
    hf_trainer_callback,
    keras_callback,
    lightning_callback,
    report,
    torch_gradient_noise,
    urllib_send,
)

__all__ = ["IN_CLUSTER_URL", "SA_DIR", "Reporter", "ReporterConfig", "Sender", "gradient_noise",
           "hf_trainer_callback", "keras_callback", "lightning_callback", "report", "torch_gradient_noise",
           "urllib_send"]
