"""Healthy workload written like PyTorch's examples/time_sequence_prediction: two LSTMCells fitted to
sine waves with LBFGS (each step evaluates a closure that zeroes the gradients and runs backward
several times), then a no_grad prediction of the future.
"""
import torch
from torch import nn, optim

import trainguard


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 24)
        self.lstm2 = nn.LSTMCell(24, 24)
        self.linear = nn.Linear(24, 1)

    def forward(self, input, future=0):
        outputs = []
        h_t = torch.zeros(input.size(0), 24, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 24, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 24, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 24, dtype=torch.double)
        output = None
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def main():
    torch.manual_seed(0); torch.set_num_threads(1)
    T, L, N = 20, 200, 40
    x = torch.arange(L).repeat(N, 1) + torch.randint(-4 * T, 4 * T, (N, 1))
    data = torch.sin(x / T).double()
    input, target = data[3:, :-1], data[3:, 1:]
    test_input, test_target = data[:3, :-1], data[:3, 1:]
    seq = Sequence().double()
    criterion = nn.MSELoss()
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=8)
    steps = 6
    guard = trainguard.watch(seq, optimizer, total_steps=steps)
    for i in range(steps):
        def closure():
            optimizer.zero_grad()
            loss = criterion(seq(input), target)
            loss.backward()
            return loss
        loss = optimizer.step(closure)
        guard.step(loss)
        with torch.no_grad():
            future = 100
            pred = seq(test_input, future=future)
            test_loss = criterion(pred[:, :-future], test_target)
        guard.eval(loss=test_loss)
        print(f"step {i}: loss {loss.item():.5f}, test loss {test_loss.item():.5f}")
    guard.finish()


if __name__ == "__main__":
    main()
