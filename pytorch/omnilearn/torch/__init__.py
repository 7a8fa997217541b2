"""omnilearn's controller in your own torchrun script (after AdaptDL's habits).

    model = HeteroDataParallel(model)                     # instead of DistributedDataParallel
    loader = HeteroDataLoader(dataset, global_batch=256)  # instead of DataLoader + DistributedSampler

See :mod:`.parallel` and :mod:`.loader`; README, "Your own torchrun script".
"""

from omnilearn.torch.loader import HeteroDataLoader
from omnilearn.torch.parallel import HeteroDataParallel

__all__ = ["HeteroDataLoader", "HeteroDataParallel"]
