"""Healthy workload written like PyTorch's examples/word_language_model (LSTM), on a synthetic corpus.

batchify / get_batch with bptt, repackage_hidden, a 2-layer LSTM with dropout, clip_grad_norm_, the
example's manual SGD update (no optimizer object: `model.zero_grad()` and `p.data.add_`), LR annealed
when validation stalls, evaluate() with model.eval().
"""
import math

import torch
from torch import nn

import trainguard


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        return torch.log_softmax(self.decoder(output), dim=-1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def corpus(n, ntoken, seed):
    """A Markov chain over ntoken words: learnable structure, no download."""
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.randint(ntoken, (ntoken, 3), generator=torch.Generator().manual_seed(5))
    out, w = [], 0
    choices = torch.randint(3, (n,), generator=gen)
    for c in choices.tolist():
        w = int(nxt[w, c])
        out.append(w)
    return torch.tensor(out)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def main():
    torch.manual_seed(1111); torch.set_num_threads(1)
    ntoken, bptt, batch_size, eval_batch_size, clip = 50, 20, 16, 10, 0.25
    train_data = batchify(corpus(16000, ntoken, 0), batch_size)
    val_data = batchify(corpus(2000, ntoken, 1), eval_batch_size)
    model = RNNModel(ntoken, 32, 32, 2)
    criterion = nn.NLLLoss()
    lr, epochs = 5.0, 3
    steps_per_epoch = math.ceil((train_data.size(0) - 1) / bptt)
    guard = trainguard.watch(model, total_steps=epochs * steps_per_epoch)

    def evaluate(data_source):
        model.eval()
        total_loss = 0.0
        hidden = model.init_hidden(eval_batch_size)
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, bptt):
                data, targets = get_batch(data_source, i, bptt)
                output, hidden = model(data, hidden)
                hidden = repackage_hidden(hidden)
                total_loss += len(data) * criterion(output.view(-1, ntoken), targets).item()
        return total_loss / (len(data_source) - 1)

    best_val_loss = None
    for epoch in range(1, epochs + 1):
        model.train()
        hidden = model.init_hidden(batch_size)
        for i in range(0, train_data.size(0) - 1, bptt):
            data, targets = get_batch(train_data, i, bptt)
            model.zero_grad()
            hidden = repackage_hidden(hidden)
            output, hidden = model(data, hidden)
            loss = criterion(output.view(-1, ntoken), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            guard.step(loss)
            guard.log(lr=lr)
        with guard.phase("eval"):
            val_loss = evaluate(val_data)
        guard.eval(loss=val_loss, perplexity=math.exp(val_loss))
        print(f"epoch {epoch}: valid loss {val_loss:.2f}, ppl {math.exp(val_loss):.2f}")
        if best_val_loss is None or val_loss < best_val_loss:
            best_val_loss = val_loss
        else:
            lr /= 4.0
    guard.finish()


if __name__ == "__main__":
    main()
