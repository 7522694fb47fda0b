"""Fine-tuning with everything frozen: the steps change nothing (TG211 step-updates-nothing).

Modelled on discuss.pytorch.org/t/84911, one of the silent bugs TrainCheck reproduced ("No trainable
layers exist" in its bug list): here the backbone is frozen for fine-tuning, and the classifier head too.
With nothing left to train, `backward()` raises "element 0 of tensors does not require grad", and the
"fix" `loss.requires_grad = True` makes the error go away and the training silently do nothing, as in
ronghuaiyang/arcface-pytorch#56 (loss no longer declines, accuracy stays at zero).
"""
import torch
from torch import nn

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
for p in model.body.parameters():
    p.requires_grad = False  # freeze the "pretrained" backbone
for p in model.head.parameters():
    p.requires_grad = False  # the bug: the new head is frozen too
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
steps = 60
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = nn.functional.cross_entropy(model(xb), yb)
    loss.requires_grad = True  # "fixes" the RuntimeError from backward()
    opt.zero_grad()
    loss.backward()
    opt.step()
    guard.step(loss)
guard.finish()
