"""A new user's DDP job over NCCL, written for trainguard's trial (benchmarks/newuser_nccl/run.sh): a tiny causal LM.

`--bug`: the barrier after rank 0's evaluation is called by rank 0 alone (the hang); without it, by every rank.
"""
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

VOCAB = 512
SEQ = 128
D_MODEL = 256
N_LAYERS = 4
BATCH = 32            # per rank
MAX_STEPS = 1500
WARMUP = 100
EVAL_EVERY = 500
LOG_EVERY = 50
LR = 1e-3
OUT_DIR = os.environ.get("OUT_DIR", "/tmp/newuser_out")
BUG = "--bug" in sys.argv


def make_data(n, seed):
    # each sequence counts up by its own stride mod VOCAB: learnable from context
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    stride = torch.randint(1, 17, (n, 1), generator=g)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(1, SEQ, D_MODEL))
        layer = nn.TransformerEncoderLayer(D_MODEL, 4, 4 * D_MODEL, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, N_LAYERS)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, x):
        h = self.tok(x) + self.pos[:, : x.size(1)]
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1), device=x.device)
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


def lr_lambda(step):
    if step < WARMUP:
        return (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, MAX_STEPS - WARMUP)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    total_loss, total_tok, exact = 0.0, 0, 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        total_loss += F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1), reduction="sum").item()
        total_tok += y.numel()
        # "slow metric": sequence exact-match computed on the host, one sample at a time
        pred = logits.argmax(-1).cpu()
        for p, t in zip(pred, y.cpu()):
            exact += int(torch.equal(p[8:], t[8:]))
        time.sleep(0.025)
    model.train()
    return total_loss / total_tok, exact / len(loader.dataset)


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    world = dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    torch.manual_seed(1234)

    train_ds = make_data(32768, seed=0)
    val_ds = make_data(400 * 64, seed=1)
    sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    train_loader = DataLoader(train_ds, batch_size=BATCH, sampler=sampler, num_workers=2,
                              pin_memory=True, drop_last=True, persistent_workers=True)
    val_loader = DataLoader(val_ds, batch_size=64, shuffle=False, num_workers=2, pin_memory=True)

    model = TinyLM().to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"world {world}, {n_params / 1e6:.2f}M params, {MAX_STEPS} steps", flush=True)
        os.makedirs(OUT_DIR, exist_ok=True)

    step, epoch = 0, 0
    t0 = time.time()
    model.train()
    while step < MAX_STEPS:
        sampler.set_epoch(epoch)
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1

            if rank == 0 and step % LOG_EVERY == 0:
                dt = (time.time() - t0) / LOG_EVERY
                t0 = time.time()
                print(f"step {step} | loss {loss.item():.4f} | lr {scheduler.get_last_lr()[0]:.2e} "
                      f"| grad_norm {grad_norm.item():.3f} | {dt * 1000:.1f} ms/step", flush=True)

            if step % EVAL_EVERY == 0 or step == MAX_STEPS:
                if rank == 0:
                    te = time.time()
                    val_loss, val_acc = evaluate(model.module, val_loader, device)
                    print(f"eval step {step} | val_loss {val_loss:.4f} | val_exact {val_acc:.3f} "
                          f"| {time.time() - te:.1f} s", flush=True)
                    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                "scheduler": scheduler.state_dict(), "step": step},
                               os.path.join(OUT_DIR, "ckpt.pt"))
                    print(f"saved checkpoint to {OUT_DIR}/ckpt.pt", flush=True)
                    if BUG:
                        dist.barrier()  # the bug: only rank 0 gets here
                if not BUG:
                    dist.barrier()
                t0 = time.time()

            if step >= MAX_STEPS:
                break
        epoch += 1

    if rank == 0:
        print("training done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
