"""omnilearn's controller in your own torchrun script (after AdaptDL's habits).

    model = HeteroDataParallel(model)                      # instead of DistributedDataParallel
    loader = HeteroDataLoader(dataset, batch_size=32)      # instead of DataLoader + DistributedSampler
    batches = HeteroBatches(get_batch, batch_size=32, steps=1000)  # a loop's own get_batch(size)

See :mod:`.parallel` and :mod:`.loader`; docs/guide/your-workload.md, "omnilearn.torch".
"""

from omnilearn.torch.loader import HeteroBatches, HeteroDataLoader
from omnilearn.torch.parallel import HeteroDataParallel
from omnilearn.train.distributed import preload_for_clean_exit

# Scripts import this package before init_process_group: this is the moment to load what would
# otherwise keep the process group alive past destroy_process_group (see the function).
preload_for_clean_exit()

__all__ = ["HeteroBatches", "HeteroDataLoader", "HeteroDataParallel"]
