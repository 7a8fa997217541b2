"""omnilearn's controller in your own torchrun script (after AdaptDL's habits).

    model = HeteroDataParallel(model)                     # instead of DistributedDataParallel
    loader = HeteroDataLoader(dataset, global_batch=256)  # instead of DataLoader + DistributedSampler

See :mod:`.parallel` and :mod:`.loader`; README, "Your own torchrun script".
"""

from omnilearn.torch.loader import HeteroDataLoader
from omnilearn.torch.parallel import HeteroDataParallel
from omnilearn.train.distributed import preload_for_clean_exit

# Scripts import this package before init_process_group: this is the moment to load what would
# otherwise keep the process group alive past destroy_process_group (see the function).
preload_for_clean_exit()

__all__ = ["HeteroDataLoader", "HeteroDataParallel"]
