"""torchrun worker: restore from a directory whose only commit is corrupt; print what each rank raised."""

import sys

import torch

from aikit.elastic.Torch import ElasticState

torch.distributed.init_process_group("gloo")
state = ElasticState(sys.argv[1], model=torch.nn.Linear(2, 1))
try:
    state.restore()
    print(f"rank {torch.distributed.get_rank()} restored", flush=True)
except Exception as error:  # the test reads what each rank saw
    print(f"rank {torch.distributed.get_rank()} raised {type(error).__name__}: {error}", flush=True)
torch.distributed.destroy_process_group()
