"""A small ResNet (BasicBlocks with BatchNorm and 1x1 shortcut convolutions, the pytorch-cifar
shape) trained in float64 with SGD (Nesterov momentum, weight decay) and a cosine schedule.

Written as PyTorch code and ported by renaming ``torch`` to ``lucid``: this file with every
``lucid`` renamed ``torch`` is the PyTorch original, and tests/acceptance runs both. The one
Lucid-only line is ``lucid.compile.fused_step`` (``--fused``): forward, loss, backward and the
SGD update as one compiled executable; without it the loop is PyTorch's eager one.

    python examples/resnet.py --fused
"""

import argparse

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
import lucid.optim as optim
from lucid.utils.data import DataLoader, TensorDataset


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(
            in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False
        )
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)

        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != self.expansion * planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(
                    in_planes, self.expansion * planes, kernel_size=1, stride=stride, bias=False
                ),
                nn.BatchNorm2d(self.expansion * planes),
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        out = F.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(self, block, num_blocks, num_classes=10, width=64):
        super().__init__()
        self.in_planes = width

        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layers = nn.Sequential(
            *[
                self._make_layer(block, width * 2**i, n, stride=1 if i == 0 else 2)
                for i, n in enumerate(num_blocks)
            ]
        )
        self.linear = nn.Linear(self.in_planes, num_classes)

    def _make_layer(self, block, planes, num_blocks, stride):
        strides = [stride] + [1] * (num_blocks - 1)
        layers = []
        for stride in strides:
            layers.append(block(self.in_planes, planes, stride))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layers(out)
        out = F.adaptive_avg_pool2d(out, 1)
        out = out.view(out.size(0), -1)
        out = self.linear(out)
        return out


def ResNet18(num_classes=10, width=64):
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, width)


def synthetic_cifar(n, image_size=32, num_classes=10, seed=0):
    """Colour 'images' whose class sets the mean of each channel and quadrant, plus noise."""
    means = lucid.randn(num_classes, 3, 2, 2, generator=lucid.Generator(), dtype=lucid.float64)
    g = lucid.Generator().manual_seed(seed)
    targets = lucid.randint(0, num_classes, (n,), generator=g)
    pattern = F.interpolate(means[targets], size=(image_size, image_size), mode="nearest")
    noise = lucid.randn(n, 3, image_size, image_size, generator=g, dtype=lucid.float64)
    return TensorDataset(pattern + noise, targets)


def train(model, loader, optimizer, criterion, step=None):
    """One epoch; ``step`` is a compiled training step doing what the eager branch does."""
    model.train()
    losses = []
    for inputs, targets in loader:
        if step is not None:
            loss = step(inputs, targets)
        else:
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = criterion(outputs, targets)
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
    return losses


def test(model, loader, criterion):
    model.eval()
    test_loss, correct, total = 0.0, 0, 0
    with lucid.no_grad():
        for inputs, targets in loader:
            outputs = model(inputs)
            test_loss += criterion(outputs, targets).item() * targets.size(0)
            correct += outputs.argmax(1).eq(targets).sum().item()
            total += targets.size(0)
    return test_loss / total, correct


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="small ResNet in float64 (synthetic data)")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--n-train", type=int, default=512)
    parser.add_argument("--n-test", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 1, 1])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fused", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    lucid.manual_seed(args.seed)
    train_set = synthetic_cifar(args.n_train, args.image_size, seed=args.seed)
    test_set = synthetic_cifar(args.n_test, args.image_size, seed=args.seed + 1)
    g = lucid.Generator().manual_seed(args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=g)
    test_loader = DataLoader(test_set, batch_size=100)

    model = ResNet(BasicBlock, args.blocks, width=args.width).double()
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(
        model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4, nesterov=True
    )
    scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    step = lucid.compile.fused_step(model, criterion, optimizer) if args.fused else None

    history = []
    for epoch in range(args.epochs):
        losses = train(model, train_loader, optimizer, criterion, step)
        test_loss, correct = test(model, test_loader, criterion)
        scheduler.step()
        history.append((losses, test_loss, correct))
        if not args.quiet:
            print(
                f"epoch {epoch}: train loss {sum(losses) / len(losses):.4f}, "
                f"test loss {test_loss:.4f}, accuracy {correct}/{len(test_set)}"
            )
    return model, history


if __name__ == "__main__":
    main()
