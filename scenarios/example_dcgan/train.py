"""Healthy workload written like PyTorch's examples/dcgan/main.py, 16x16 synthetic images (no download).

Generator and discriminator with batch norm, BCELoss, two Adam optimizers, `netD.zero_grad()` /
`netG.zero_grad()` (errG's backward also reaches D's gradients, reset by the next `netD.zero_grad()`),
and a look at `fixed_noise` under no_grad in training mode. The guard watches D and its optimizer.
"""
import torch
from torch import nn, optim

import trainguard

nz, ngf, ndf, nc = 16, 16, 16, 1


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, nc, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


def main():
    torch.manual_seed(999); torch.set_num_threads(1)
    # "real" images: blurred blobs at random places
    gen = torch.Generator().manual_seed(0)
    centres = torch.randint(3, 13, (2048, 2), generator=gen).float()
    grid = torch.stack(torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij"), -1)
    dist = ((grid[None] - centres[:, None, None]) ** 2).sum(-1)
    images = (torch.exp(-dist / 8.0) * 2 - 1).unsqueeze(1)
    dataloader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images), batch_size=64, shuffle=True)
    netG, netD = Generator(), Discriminator()
    netG.apply(weights_init); netD.apply(weights_init)
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(16, nz, 1, 1)
    real_label, fake_label = 1.0, 0.0
    optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))
    niter = 3
    guard = trainguard.watch(netD, optimizerD, total_steps=niter * len(dataloader))
    for epoch in range(niter):
        for i, (real_cpu,) in enumerate(guard.batches(dataloader)):
            # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
            netD.zero_grad()
            batch_size = real_cpu.size(0)
            label = torch.full((batch_size,), real_label)
            errD_real = criterion(netD(real_cpu), label)
            errD_real.backward()
            noise = torch.randn(batch_size, nz, 1, 1)
            fake = netG(noise)
            label.fill_(fake_label)
            errD_fake = criterion(netD(fake.detach()), label)
            errD_fake.backward()
            errD = errD_real + errD_fake
            optimizerD.step()
            # (2) Update G network: maximize log(D(G(z)))
            netG.zero_grad()
            label.fill_(real_label)
            errG = criterion(netD(fake), label)
            errG.backward()
            optimizerG.step()
            guard.step(errD, parts={"real": errD_real, "fake": errD_fake})
            guard.log(errG=errG)
            if i % 20 == 0:
                with torch.no_grad():
                    fake = netG(fixed_noise).detach()
        print(f"epoch {epoch}: Loss_D {errD.item():.4f} Loss_G {errG.item():.4f}")
    guard.finish()


if __name__ == "__main__":
    main()
