"""Two gloo ranks on the CPU; rank 1 skips one all-reduce (a rank-dependent branch at step 20).

From then on the ranks pair the wrong collectives: rank 1 reaches the final barrier while rank 0 still
waits in its last all-reduce, and both wait forever (the default process-group timeout is 30 minutes).
The launcher (this script without arguments) starts both ranks and waits for them, as torchrun does.
"""
import datetime
import os
import socket
import subprocess
import sys

import torch


def launch() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, str(rank)],
                              env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_PORT": str(port)})
             for rank in (0, 1)]
    return max(p.wait() for p in procs)


def train(rank: int) -> None:
    import torch.distributed as dist

    import trainguard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(minutes=10))
    torch.manual_seed(rank)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, total_steps=40)
    for step in range(1, 41):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        logged = loss.detach().clone()
        if rank == 0 or step != 20:  # the planted bug: rank 1 skips one all-reduce
            dist.all_reduce(logged)
    dist.barrier()
    guard.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        train(int(sys.argv[1]))
    else:
        sys.exit(launch())
