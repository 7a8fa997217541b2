"""Run by tests/integration/test_frameworks.py under torchrun: omnilearn.hf's guarantees on 2 gloo ranks.

First two wrong set-ups, each of which must be one UserError on every rank; then a Trainer run
whose steps are checked by framework_checks.report (and the weights at the first step compared
with those before the start-up probe).
"""

import os
import sys

import torch
import torch.nn.functional as F
from framework_checks import EPOCHS, GLOBAL_BATCH, Indexed, Recorder, report, slow_down, tiny_net
from torch import nn
from torch.utils.data import IterableDataset
from transformers import TrainerCallback, TrainingArguments

from omnilearn.errors import UserError
from omnilearn.hf import HeteroTrainer


class Classifier(nn.Module):
    """A model as the Trainer wants one: keyword inputs, labels in, the loss out."""

    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_net()
        self.recorder = Recorder(self.net)
        self.slow_rank = 1  # until the second epoch, then rank 0: the probe sees the first, the steps the change

    def forward(self, x, labels, idx):
        if self.training:
            self.recorder.before(idx)
            slow_down(len(labels), rank=self.slow_rank)
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class RecordGrads(TrainerCallback):
    def __init__(self, model: Classifier) -> None:
        self.model = model
        self.trainer: HeteroTrainer | None = None

    def on_train_begin(self, args, state, control, **kwargs):  # before omnilearn's: its probe runs after this
        self.model.started_with = {k: v.detach().clone() for k, v in self.model.net.state_dict().items()}

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.model.slow_rank = 1 if state.epoch < 1 else 0

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.model.recorder.grads(self.trainer.session.weight)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(Indexed(as_dict=True))


def arguments(folder: str, **kwargs) -> TrainingArguments:
    return TrainingArguments(output_dir=folder, per_device_train_batch_size=GLOBAL_BATCH // int(os.environ["WORLD_SIZE"]),
                             num_train_epochs=EPOCHS, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant",
                             weight_decay=0.0, max_grad_norm=0.0, use_cpu=True, report_to="none", save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, ddp_find_unused_parameters=False, **kwargs)


def main() -> None:
    out, folder = sys.argv[1], sys.argv[2]
    data = Indexed(as_dict=True)
    errors = []
    try:
        HeteroTrainer(model=Classifier(), args=arguments(folder, gradient_accumulation_steps=2), train_dataset=data)
    except UserError as e:
        errors.append(str(e))
    try:
        HeteroTrainer(model=Classifier(), args=arguments(folder, max_steps=4), train_dataset=Stream()).train()
    except UserError as e:
        errors.append(str(e))
    torch.manual_seed(int(os.environ["RANK"]))  # different starts: DDP must make them equal
    model = Classifier()
    record = RecordGrads(model)
    trainer = HeteroTrainer(model=model, args=arguments(folder), train_dataset=data, policy="dynamic", out=out,
                            callbacks=[record])
    record.trainer = trainer
    trainer.train()
    report(model.recorder, data, len(trainer.shares),
           {"errors": errors, "broadcast_buffers": trainer.model_wrapped.broadcast_buffers,
            # the start-up probe's steps left the weights as they were
            "probe_left_no_trace": all(torch.equal(v, model.recorder.steps[0][0][k])
                                       for k, v in model.started_with.items())})
    # the process group is left alive, as a Trainer script leaves it: omnilearn.hf ends it at exit (the
    # test asserts a clean exit status)


if __name__ == "__main__":
    main()
