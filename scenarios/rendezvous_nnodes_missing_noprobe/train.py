"""torchrun --nnodes=2 with only node 0 started, no code change (TG712 rendezvous-incomplete).

Modelled on pytorch/pytorch#52848 ("init_process_group with launch.py --nnode=2 hangs always in all
machines"; the usual cause named there: a world declared larger than the processes that come). torchrun's
static rendezvous (the default backend with --master-addr/--master-port) hosts a TCPStore on node 0 and
waits for node 1's agent, which nobody starts: no rank runs, nothing is printed until the rendezvous
timeout (600 s by default, 75 s here through --rdzv-conf so the scenario ends, with room for the watch under a loaded machine).
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(20):
    x = torch.randn(16, 8)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
dist.destroy_process_group()
