"""A tiny Hugging Face Trainer run on the CPU with TrainguardCallback, healthy or with one planted failure.

    python tests/integrations/hf_train.py --out OUT --run-dir RUN [--plant lr-zero|nan|frozen]

The model is a plain torch module returning `{"loss", "logits"}` (the Trainer's contract); no download.
"""
import argparse

import torch
from torch import nn
from transformers import Trainer, TrainingArguments

from trainguard.integrations.hf import TrainguardCallback

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--run-dir", required=True)
p.add_argument("--plant", default="none")
p.add_argument("--steps", type=int, default=40)
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)


class TinyRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        self.calls = 0

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        loss = nn.functional.mse_loss(out, labels)
        if self.training:
            self.calls += 1
            if a.plant == "nan" and self.calls >= 30:  # a NaN from micro-batch 30 on
                loss = loss * float("nan")
        return {"loss": loss, "logits": out}


w = torch.randn(8)
xs = torch.randn(256, 8)
ys = xs @ w + 0.05 * torch.randn(256)
data = [{"x": xs[i], "labels": ys[i]} for i in range(256)]
model = TinyRegressor()
args = TrainingArguments(
    output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=8, gradient_accumulation_steps=2,
    learning_rate=1e-2, warmup_steps=4, logging_steps=2, eval_strategy="steps", eval_steps=20,
    save_strategy="steps", save_steps=20, report_to=[], use_cpu=True, dataloader_num_workers=0,
    disable_tqdm=True, seed=0,
)
optimizers = (None, None)
if a.plant == "lr-zero":
    # sized in micro-batches, stepped per optimizer step: linear decay to 0 over 5 steps, then 0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    optimizers = (opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / 5)))
elif a.plant == "frozen":
    other = TinyRegressor()  # the optimizer holds another model's parameters
    opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    optimizers = (opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))
trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:32], optimizers=optimizers,
                  callbacks=[TrainguardCallback(run_dir=a.run_dir)])
trainer.train()
print("Training complete")
