#!/usr/bin/env bash
# aikit's main job from nothing: set up .venv, print the plan table (Run:AI's AIkit Elastic's), then train a small CNN
# on the embedded digits with a global batch of 256, elastic over the devices found (one CPU
# process: 4 GA steps of 64). Extra arguments go to the example.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
aikit plan --global-batch-size 256 --max-device-batch 64
python examples/torch_elastic_digits.py "$@"
