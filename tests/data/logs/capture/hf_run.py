# ruff: noqa: E501, E702 -- kept as run to capture the fixture beside it (see ../README.md)
import torch
from torch.utils.data import Dataset
from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments

torch.manual_seed(0)
class Cfg(PretrainedConfig):
    model_type = "tiny"
class Tiny(PreTrainedModel):
    config_class = Cfg
    def __init__(self, config):
        super().__init__(config); self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}
X = torch.randn(320, 8); Y = (X @ torch.randn(8, 1) > 0).float()
class D(Dataset):
    def __len__(self): return len(X)
    def __getitem__(self, i): return {"x": X[i], "labels": Y[i]}
args = TrainingArguments(output_dir="/tmp/cap17w/hf_out", num_train_epochs=3, per_device_train_batch_size=32, logging_steps=5, learning_rate=0.1, report_to=[], save_strategy="no", use_cpu=True)
Trainer(model=Tiny(Cfg()), args=args, train_dataset=D()).train()
