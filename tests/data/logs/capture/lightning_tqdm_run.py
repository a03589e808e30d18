# ruff: noqa: E501, E702 -- kept as run to capture the fixture beside it (see ../README.md)
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(320, 8); y = (x @ torch.randn(8, 1) > 0).float()
class M(L.LightningModule):
    def __init__(self):
        super().__init__(); self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    def training_step(self, batch, i):
        xb, yb = batch
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self.net(xb), yb)
        self.log("train_loss", loss, prog_bar=True)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
L.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[L.pytorch.callbacks.TQDMProgressBar()]).fit(M(), DataLoader(TensorDataset(x, y), batch_size=32))
