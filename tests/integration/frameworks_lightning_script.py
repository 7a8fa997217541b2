"""Run by tests/integration/test_frameworks.py under torchrun: omnilearn.lightning's guarantees on 2 gloo ranks.

First two wrong set-ups, each of which must be one UserError on every rank; then a real fit whose
steps are checked by framework_checks.report (and the broadcasts issued between its steps counted:
Lightning's per-step SIGTERM broadcast rides the all-reduce instead; and the weights at the first
step compared with those before the start-up probe); then a fit in which rank 1 alone
catches SIGTERM, after which both ranks must stop at the same step (each prints one line).
"""

import gc
import json
import os
import sys

import lightning as L
import torch
import torch.nn.functional as F
from framework_checks import EPOCHS, GLOBAL_BATCH, Indexed, Recorder, report, slow_down, tiny_net
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, WeightedRandomSampler

from omnilearn.errors import UserError
from omnilearn.lightning import HeteroDDPStrategy

BROADCASTS = [0]
_broadcast = torch.distributed.broadcast


def counted_broadcast(*args, **kwargs):
    BROADCASTS[0] += 1
    return _broadcast(*args, **kwargs)


torch.distributed.broadcast = counted_broadcast


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_net()
        self.recorder = Recorder(self.net)
        self.broadcasts: list[int] = []  # broadcasts issued so far, at each step's start
        self.sigterm_at: int | None = None  # rank 1 catches SIGTERM in this step

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        # rank 1 is the slow one until the second epoch, then rank 0: the start-up probe sees the
        # first, the measured steps must see the change
        slow_down(len(y), rank=1 if self.current_epoch == 0 else 0)
        if self.sigterm_at == batch_idx and self.trainer.global_rank == 1:
            self.trainer._signal_connector.received_sigterm = True  # what Lightning's handler sets
        return F.cross_entropy(self.net(x), y)

    def on_train_start(self):  # before the strategy's: its start-up probe runs after this
        self.started_with = {k: v.detach().clone() for k, v in self.net.state_dict().items()}

    def on_train_batch_start(self, batch, batch_idx):
        self.recorder.before(batch[2])
        self.broadcasts.append(BROADCASTS[0])

    def on_before_optimizer_step(self, optimizer):
        self.recorder.grads(self.trainer.strategy.session.weight)
        self.broadcast_buffers = self.trainer.strategy.model.broadcast_buffers  # DDP's, while it wraps the module

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(out: str | None = None, **kwargs) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]), max_epochs=EPOCHS,
                     strategy=HeteroDDPStrategy(policy="dynamic", out=out), logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **kwargs)


def refused(fit) -> str:
    try:
        fit()
    except UserError as e:
        return str(e)
    return ""


def main() -> None:
    out = sys.argv[1]
    data = Indexed()
    batch = GLOBAL_BATCH // int(os.environ["WORLD_SIZE"])
    errors = [
        refused(lambda: trainer(accumulate_grad_batches=2).fit(Classifier(), DataLoader(data, batch_size=batch))),
        refused(lambda: trainer().fit(Classifier(), DataLoader(
            data, batch_size=batch, sampler=WeightedRandomSampler(torch.ones(len(data)), len(data))))),
    ]
    torch.manual_seed(int(os.environ["RANK"]))  # different starts: DDP must make them equal
    model = Classifier()
    run = trainer(out)
    run.fit(model, DataLoader(data, batch_size=batch, shuffle=True))  # Lightning's own sampler stays on
    report(model.recorder, data, len(run.train_dataloader),
           {"errors": errors, "broadcast_buffers": model.broadcast_buffers,
            "broadcasts_between_steps": model.broadcasts[-1] - model.broadcasts[0],
            # the start-up probe's steps left the weights as they were
            "probe_left_no_trace": all(torch.equal(v, model.recorder.steps[0][0][k])
                                       for k, v in model.started_with.items())})
    del run  # the DDP model holds the process group: gone before the group, its threads end with it
    stopping = Classifier()
    stopping.sigterm_at = 2
    try:
        trainer(sys.argv[2]).fit(stopping, DataLoader(data, batch_size=batch))
    except SIGTERMException:
        # one write per line: both ranks print to one pipe, and print() writes the newline apart
        sys.stdout.write(json.dumps({"stopped_rank": int(os.environ["RANK"]), "steps": len(stopping.recorder.steps)})
                         + "\n")
        sys.stdout.flush()
    gc.collect()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
