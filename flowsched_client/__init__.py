"""flowsched's training-side client: report progress from a training loop at no cost to it.

    pip install ./client        # standard library only (docs/progress-api.md)

    from flowsched_client import report
    report(step, loss)          # loss may be a framework tensor; nothing waits for the device

Defaults come from the pod: FLOWSCHED_URL, FLOWSCHED_JOB (else the pod's hostname), the
namespace and token of the mounted service account.
"""

from flowsched_client.callbacks import (
    hf_rule,
    hf_trainer_callback,
    keras_callback,
    keras_rule,
    lightning_callback,
    lightning_max_steps,
    lightning_rule,
)
from flowsched_client.gradients import gradient_noise, torch_gradient_noise
from flowsched_client.reporter import (
    IN_CLUSTER_URL,
    SA_DIR,
    Reporter,
    ReporterConfig,
    Sender,
    report,
    to_floats,
    urllib_send,
)

__all__ = ["IN_CLUSTER_URL", "SA_DIR", "Reporter", "ReporterConfig", "Sender", "gradient_noise", "hf_rule",
           "hf_trainer_callback", "keras_callback", "keras_rule", "lightning_callback", "lightning_max_steps",
           "lightning_rule", "report", "to_floats", "torch_gradient_noise", "urllib_send"]
