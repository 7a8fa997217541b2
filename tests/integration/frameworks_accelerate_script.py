"""Run by tests/integration/test_frameworks.py under torchrun: omnilearn.accelerate's guarantees on 2 gloo ranks.

First two wrong set-ups, each of which must be one UserError on every rank; then an Accelerate loop
whose loader draws ahead of training (a worker process), its steps checked by framework_checks.report.
"""

import gc
import os
import sys

import torch
import torch.nn.functional as F
from framework_checks import EPOCHS, GLOBAL_BATCH, Indexed, Recorder, report, slow_down, tiny_net
from torch.utils.data import DataLoader, WeightedRandomSampler

from omnilearn.accelerate import HeteroAccelerator
from omnilearn.errors import UserError


def main() -> None:
    out = sys.argv[1]
    data = Indexed()
    batch = GLOBAL_BATCH // int(os.environ["WORLD_SIZE"])
    errors = []
    try:
        HeteroAccelerator(cpu=True, gradient_accumulation_steps=2)
    except UserError as e:
        errors.append(str(e))
    accelerator = HeteroAccelerator(cpu=True, policy="dynamic", out=out)
    try:
        accelerator.share_batches(DataLoader(data, batch_size=batch,
                                             sampler=WeightedRandomSampler(torch.ones(len(data)), len(data))))
    except UserError as e:
        errors.append(str(e))
    torch.manual_seed(accelerator.process_index)  # different starts: DDP must make them equal
    net = tiny_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    # a worker process draws batches two steps ahead of training: each step keeps the shares it was drawn with
    loader = accelerator.share_batches(DataLoader(data, batch_size=batch, shuffle=True, num_workers=1))
    try:
        accelerator.start_up(lambda b: accelerator.backward(F.cross_entropy(net(b[0]), b[1])))  # before prepare
    except UserError as e:
        errors.append(str(e))
    model, optimizer, loader = accelerator.prepare(net, optimizer, loader)
    started_with = {k: v.detach().clone() for k, v in net.state_dict().items()}
    # the start-up probe on the loop's own step, the slower rank slower there too
    accelerator.start_up(lambda b, m=model: (slow_down(len(b[1])), accelerator.backward(F.cross_entropy(m(b[0]), b[1]))))
    recorder = Recorder(net)
    for epoch in range(EPOCHS):
        for x, y, idx in loader:
            recorder.before(idx)
            slow_down(len(y), rank=1 if epoch == 0 else 0)  # the ranks swap speeds: the steps must move the split
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            recorder.grads(accelerator.session.weight)
            optimizer.step()
            optimizer.zero_grad()
    report(recorder, data, len(loader), {"errors": errors, "broadcast_buffers": model.broadcast_buffers,
                                         # the start-up probe's steps left the weights as they were
                                         "probe_left_no_trace": all(torch.equal(v, recorder.steps[0][0][k])
                                                                    for k, v in started_with.items())})
    del model, optimizer, loader  # the DDP model holds the process group: gone before the group, its threads end with it
    gc.collect()
    accelerator.end_training()  # destroys the process group


if __name__ == "__main__":
    main()
