"""Healthy twin of lora_reentrant_checkpoint_noprobe: the same LoRA model under `checkpoint(...,
use_reentrant=False)`, which needs no input that requires grad: every adapter gets its gradient. Quiet."""
import torch
from torch.utils.checkpoint import checkpoint

REENTRANT = False  # the fix: the non-reentrant variant needs no input that requires grad


class LoRALinear(torch.nn.Module):
    def __init__(self, dim: int, rank: int = 4) -> None:
        super().__init__()
        self.base = torch.nn.Linear(dim, dim).requires_grad_(False)  # the frozen pretrained weight
        self.lora_A = torch.nn.Parameter(torch.randn(rank, dim) * 0.01)
        self.lora_B = torch.nn.Parameter(torch.zeros(dim, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.lora_A.t() @ self.lora_B.t()


class Model(torch.nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim).requires_grad_(False)
        self.blocks = torch.nn.ModuleList([LoRALinear(dim) for _ in range(2)])
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = checkpoint(lambda t, b=block: torch.relu(b(t)), h, use_reentrant=REENTRANT)
        return self.head(h)


torch.manual_seed(0); torch.set_num_threads(1)
model = Model()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
for step in range(1, 121):
    ids = torch.randint(0, 64, (16, 12))
    logits = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 20 == 0:
        print(f"step {step} loss={loss.item():.4f}", flush=True)
