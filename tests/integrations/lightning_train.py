"""A tiny Lightning fit on the CPU with TrainguardCallback, healthy or with one planted failure.

    python tests/integrations/lightning_train.py --out OUT --run-dir RUN [--plant lr-zero|nan|frozen] [--logger csv|tb]
"""
import argparse

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainguard.integrations.lightning import TrainguardCallback

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--run-dir", required=True)
p.add_argument("--plant", default="none")
p.add_argument("--logger", default="csv")
p.add_argument("--steps", type=int, default=40)
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        self.calls = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.calls += 1
        if a.plant == "nan" and self.calls >= 30:  # a NaN from micro-batch 30 on
            loss = loss * float("nan")
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x).squeeze(-1), y))

    def configure_optimizers(self):
        # the frozen plant's optimizer holds a module the model never uses
        params = nn.Linear(8, 1).parameters() if a.plant == "frozen" else self.net.parameters()
        opt = torch.optim.AdamW(params, lr=1e-2)
        if a.plant == "lr-zero":  # decays to 0 over 5 steps, then holds 0
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / 5))
        else:
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


w = torch.randn(8)
xs = torch.randn(256, 8)
ys = xs @ w + 0.05 * torch.randn(256)
train = DataLoader(TensorDataset(xs, ys), batch_size=8, shuffle=True)
val = DataLoader(TensorDataset(xs[:32], ys[:32]), batch_size=16)
logger = CSVLogger(a.out) if a.logger == "csv" else TensorBoardLogger(a.out)
trainer = L.Trainer(max_steps=a.steps, accumulate_grad_batches=2, val_check_interval=20, log_every_n_steps=1,
                    accelerator="cpu", devices=1, logger=logger, enable_model_summary=False,
                    default_root_dir=a.out, callbacks=[TrainguardCallback(run_dir=a.run_dir), LearningRateMonitor("step")])
trainer.fit(Tiny(), train, val)
print("Training complete")
