#!/usr/bin/env bash
# aikit's main job from nothing: set up .venv, then the elastic training demo.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
aikit plan --global-batch-size 256 --max-gpu-batch-size 64
