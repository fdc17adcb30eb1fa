"""Lightning: Trainer.fit with mm_collate batches, moved by Lightning's own transfer_batch_to_device."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from pincollate import Batch, mm_collate
from samples import assert_same

L = pytest.importorskip("lightning.pytorch")

# Lightning's own notices (its pytree use, worker-count hints), not about the batches.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:lightning.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


class _Records(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(8, generator=g), "y": float(i % 2), "name": f"r{i}"}


class _Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.seen: list[Batch] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch)
        out = self.layer(batch["x"]).squeeze(1)
        return torch.nn.functional.mse_loss(out, batch["y"].float())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("workers", [0, 2])
def test_trainer_fit_sees_default_collate_values(workers):
    model = _Model()
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(_Records(), batch_size=4, collate_fn=mm_collate, num_workers=workers)
    trainer.fit(model, loader)
    assert len(model.seen) == 4
    reference = list(DataLoader(_Records(), batch_size=4))
    for ours, theirs in zip(model.seen, reference, strict=True):
        assert_same(dict(ours), theirs)
    moved = model.transfer_batch_to_device(model.seen[0], torch.device("cpu"), 0)
    assert isinstance(moved, Batch) and moved.layout is not None
    assert_same(dict(moved), default_collate([_Records()[i] for i in range(4)]))


class _Data(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(_Records(), batch_size=4, collate_fn=mm_collate)

    def val_dataloader(self):
        return DataLoader(_Records(), batch_size=8, collate_fn=mm_collate)

    def predict_dataloader(self):
        return DataLoader(_Records(), batch_size=8, collate_fn=mm_collate)


class _Full(_Model):
    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch["x"]).squeeze(1), batch["y"].float()))

    def predict_step(self, batch, batch_idx):
        return batch["name"], self.layer(batch["x"]).squeeze(1)


def test_datamodule_validate_predict_and_bf16():
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        precision="bf16-mixed",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model, data = _Full(), _Data()
    trainer.fit(model, datamodule=data)
    (metrics,) = trainer.validate(model, datamodule=data, verbose=False)
    assert torch.isfinite(torch.tensor(metrics["val_loss"]))
    predictions = trainer.predict(model, datamodule=data)
    assert [names for names, _ in predictions] == [[f"r{i}" for i in range(8)], [f"r{i}" for i in range(8, 16)]]
