"""Drives trainguard's Ultralytics adapter the way `ultralytics.engine.trainer.BaseTrainer` does.

Ultralytics cannot be imported on this project's machines (it needs torchvision, whose PyPI wheel does
not load beside the CPU torch wheel), so this script replays BaseTrainer's callback sequence (8.4:
`run_callbacks` order, `loss_items` as a dict, optimizer steps every `accumulate` batches, validation
then `on_model_save` then `on_fit_epoch_end`) with a real torch model, optimizer and scheduler.

    python tests/integrations/ultralytics_like.py [--plant nan|lr-zero]
"""
import argparse
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from trainguard.integrations.ultralytics import attach

p = argparse.ArgumentParser()
p.add_argument("--plant", default="none")
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)


class Model:  # the part of ultralytics.engine.model.Model that attach() uses
    def __init__(self) -> None:
        self.callbacks: dict[str, list] = {}

    def add_callback(self, event: str, func) -> None:
        self.callbacks.setdefault(event, []).append(func)


net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 2))
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
lam = (lambda e: max(0.0, 1 - e / 1)) if a.plant == "lr-zero" else (lambda e: 1 - 0.1 * e)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
W = torch.randn(8, 2)
xs = [torch.randn(16, 8) for _ in range(40)]
loader = [(x, x @ W) for x in xs]  # learnable targets: a healthy run's loss must fall
trainer = SimpleNamespace(model=net, optimizer=opt, scheduler=sched, scaler=None, train_loader=loader, epochs=4,
                          accumulate=2, args=SimpleNamespace(epochs=4, batch=16, workers=0, amp=False),
                          loss_items=None, loss_names=(), metrics={}, last=Path("weights/last.pt"), epoch=0)
model = Model()
attach(model)


def run(event: str) -> None:
    for cb in model.callbacks.get(event, []):
        cb(trainer)


run("on_pretrain_routine_end")
run("on_train_start")
last_opt = -1
for epoch in range(trainer.epochs):
    trainer.epoch = epoch
    for i, (x, y) in enumerate(loader):
        ni = i + len(loader) * epoch
        out = net(x)
        box = nn.functional.mse_loss(out[:, 0], y[:, 0])
        cls = nn.functional.mse_loss(out[:, 1], y[:, 1])
        if a.plant == "nan" and ni >= 50:
            cls = cls * float("nan")
        trainer.loss_items = {"box_loss": box.detach(), "cls_loss": cls.detach()}
        (box + cls).backward()
        if ni - last_opt >= trainer.accumulate:
            opt.step()
            opt.zero_grad()
            last_opt = ni
        run("on_train_batch_end")
    run("on_train_epoch_end")
    with torch.no_grad():
        trainer.metrics = {"metrics/mAP50(B)": 0.1 * epoch, "val/box_loss": float(box)}
    Path("weights").mkdir(exist_ok=True)
    torch.save(net.state_dict(), trainer.last)
    run("on_model_save")
    sched.step()
    run("on_fit_epoch_end")
run("on_train_end")
print("Training complete")
