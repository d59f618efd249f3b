"""``lucid.utils.data``: datasets, samplers and the ``DataLoader``, as ``torch.utils.data``."""

from lucid.utils.data.dataloader import (
    DataLoader,
    WorkerInfo,
    default_collate,
    default_convert,
    get_worker_info,
)
from lucid.utils.data.dataset import (
    ConcatDataset,
    Dataset,
    IterableDataset,
    Subset,
    TensorDataset,
    random_split,
)
from lucid.utils.data.distributed import DistributedSampler
from lucid.utils.data.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
)

__all__ = [
    "BatchSampler",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WorkerInfo",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "random_split",
]
