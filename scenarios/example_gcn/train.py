"""Healthy workload written like PyTorch's examples/gcn (Kipf & Welling's GCN), on a synthetic
stochastic-block-model graph with a sparse normalised adjacency: full-batch training on a node mask,
dropout, model.eval() for the validation accuracy.
"""
import torch
import torch.nn.functional as F
from torch import nn

import trainguard


class GraphConv(nn.Module):
    def __init__(self, input_dim, output_dim, use_bias=True):
        super().__init__()
        self.kernel = nn.Parameter(torch.empty(input_dim, output_dim))
        nn.init.xavier_normal_(self.kernel)
        self.bias = nn.Parameter(torch.zeros(output_dim)) if use_bias else None

    def forward(self, input_tensor, adj_mat):
        support = torch.mm(input_tensor, self.kernel)
        output = torch.sparse.mm(adj_mat, support)
        return output + self.bias if self.bias is not None else output


class GCN(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim, dropout_p=0.5):
        super().__init__()
        self.gc1 = GraphConv(input_dim, hidden_dim)
        self.gc2 = GraphConv(hidden_dim, output_dim)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, input_tensor, adj_mat):
        x = F.relu(self.gc1(input_tensor, adj_mat))
        x = self.dropout(x)
        return F.log_softmax(self.gc2(x, adj_mat), dim=1)


def block_graph(n=600, classes=6, feat=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(classes, (n,), generator=gen)
    same = labels[:, None] == labels[None, :]
    prob = torch.where(same, torch.tensor(0.05), torch.tensor(0.003))
    edges = torch.rand(n, n, generator=gen) < prob
    edges = edges | edges.t() | torch.eye(n, dtype=torch.bool)
    deg = edges.sum(1).float()
    idx = edges.nonzero().t()
    vals = 1.0 / torch.sqrt(deg[idx[0]] * deg[idx[1]])
    adj = torch.sparse_coo_tensor(idx, vals, (n, n)).coalesce()
    centres = torch.randn(classes, feat, generator=gen)
    features = centres[labels] * 0.3 + torch.randn(n, feat, generator=gen)
    return features, labels, adj


def main():
    torch.manual_seed(42); torch.set_num_threads(1)
    features, labels, adj = block_graph()
    idx_train, idx_val, idx_test = torch.arange(0, 200), torch.arange(200, 400), torch.arange(400, 600)
    gcn = GCN(features.shape[1], 16, int(labels.max()) + 1)
    optimizer = torch.optim.Adam(gcn.parameters(), lr=0.01, weight_decay=5e-4)
    epochs = 120
    guard = trainguard.watch(gcn, optimizer, total_steps=epochs)

    def test(idx):
        gcn.eval()
        with torch.no_grad():
            output = gcn(features, adj)
            loss = F.nll_loss(output[idx], labels[idx])
            acc = (output[idx].argmax(1) == labels[idx]).float().mean()
        return loss.item(), acc.item()

    for epoch in range(epochs):
        gcn.train()
        optimizer.zero_grad()
        output = gcn(features, adj)
        loss = F.nll_loss(output[idx_train], labels[idx_train])
        loss.backward()
        optimizer.step()
        guard.step(loss)
        if (epoch + 1) % 20 == 0:
            with guard.phase("eval"):
                val_loss, val_acc = test(idx_val)
            guard.eval(loss=val_loss, accuracy=val_acc)
            print(f"epoch {epoch + 1}: train loss {loss.item():.4f}, val loss {val_loss:.4f}, val acc {val_acc:.3f}")
    print("test", test(idx_test))
    guard.finish()


if __name__ == "__main__":
    main()
