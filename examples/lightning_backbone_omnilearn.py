"""lightning_backbone.py with omnilearn's controller: Lightning's DDP strategy replaced by omnilearn's.

The same parts as there: a ``Backbone`` module (two linear layers), a ``LitClassifier`` system that
trains it, a ``MyDataModule`` with train/val/test/predict loaders, and a main that fits, tests and
predicts. Two things differ, so that it runs here. The data is scikit-learn's handwritten digits at
MNIST's 28x28, each at 25 small shifts (no download; 37,425 training images, 7,500 test). The flags
are read with argparse under the names LightningCLI gives them (LightningCLI needs jsonargparse,
which the project does not install).


    torchrun --nproc-per-node 4 examples/lightning_backbone_omnilearn.py --trainer.max_epochs 2 --policy dynamic

The rest of this docstring is lightning_backbone.py's: docs/guide/frameworks.md shows the diff.
"""

import argparse
import os

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer, seed_everything
from omnilearn.lightning import HeteroDDPStrategy
from sklearn.datasets import load_digits
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, random_split


class Digits(Dataset):
    """scikit-learn's 1,797 digits as MNIST-like 1x28x28 images in [0, 1], each at 25 shifts of up to 2 pixels.

    The first 1,497 digits give the training images (37,425), the last 300 the test images (7,500).
    """

    def __init__(self, train: bool = True) -> None:
        bunch = load_digits()
        part = slice(0, 1497) if train else slice(1497, None)
        digits = F.interpolate(torch.tensor(bunch.images[part], dtype=torch.float32).unsqueeze(1) / 16.0,
                               size=(24, 24), mode="bilinear", align_corners=False)
        framed = F.pad(digits, (2, 2, 2, 2))
        self.images = torch.cat([framed.roll((dy, dx), dims=(2, 3)) for dy in range(-2, 3) for dx in range(-2, 3)])
        self.labels = torch.tensor(bunch.target[part]).repeat(25)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i]


class Backbone(torch.nn.Module):
    def __init__(self, hidden_dim: int = 128) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(28 * 28, hidden_dim)
        self.l2 = torch.nn.Linear(hidden_dim, 10)

    def forward(self, x):
        x = x.view(x.size(0), -1)
        return torch.relu(self.l2(torch.relu(self.l1(x))))


class LitClassifier(LightningModule):
    def __init__(self, backbone: Backbone | None = None, learning_rate: float = 0.0001) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["backbone"])
        self.backbone = backbone if backbone is not None else Backbone()

    def forward(self, x):
        return self.backbone(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("valid_loss", F.cross_entropy(self(x), y), on_step=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=None):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)


class MyDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        dataset = Digits(train=True)
        self.digits_test = Digits(train=False)
        self.digits_train, self.digits_val = random_split(dataset, [32425, 5000],
                                                          generator=torch.Generator().manual_seed(42))
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.digits_train, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.digits_val, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.digits_test, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.digits_test, batch_size=self.batch_size)


def cli_main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trainer.max_epochs", dest="max_epochs", type=int, default=2)
    p.add_argument("--trainer.accelerator", dest="accelerator", default="cpu")
    p.add_argument("--trainer.devices", dest="devices", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    p.add_argument("--trainer.strategy", dest="strategy", default="ddp")
    p.add_argument("--trainer.default_root_dir", dest="root", default=None)
    p.add_argument("--model.backbone.hidden_dim", dest="hidden_dim", type=int, default=128)
    p.add_argument("--model.learning_rate", dest="learning_rate", type=float, default=0.0001)
    p.add_argument("--data.batch_size", dest="batch_size", type=int, default=32)
    p.add_argument("--policy", default="dynamic")
    args = p.parse_args()
    seed_everything(1234)
    model, datamodule = LitClassifier(Backbone(args.hidden_dim), args.learning_rate), MyDataModule(args.batch_size)
    trainer = Trainer(max_epochs=args.max_epochs, accelerator=args.accelerator, devices=args.devices,
                      strategy=HeteroDDPStrategy(policy=args.policy, per_level_threads=True), default_root_dir=args.root)
    trainer.fit(model, datamodule=datamodule)
    trainer.test(ckpt_path="best", datamodule=datamodule)
    predictions = trainer.predict(ckpt_path="best", datamodule=datamodule)
    print(predictions[0].argmax(dim=1))


if __name__ == "__main__":
    cli_main()
