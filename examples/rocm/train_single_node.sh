#!/usr/bin/env bash
# One node, all its GPUs: examples/rocm/train_single_node.sh TRAIN.yaml [mi300x|mi250]
# llamafactory-cli re-launches itself through torchrun with NPROC_PER_NODE workers (docs/rocm.md).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# AMD's settings per GPU, shipped in the package (the files `llamafactory-zebra doctor` names).
envs="$here/../../llamafactory_zebra/environment/rocm"
config="${1:?usage: $0 TRAIN.yaml [mi300x|mi250]}"
gpu="${2:-mi300x}"
[ -f "$envs/$gpu.env" ] || { echo "unknown GPU '$gpu': use mi300x or mi250" >&2; exit 2; }

set -a
. "$envs/$gpu.env"
set +a
if [ "$(cat /proc/sys/kernel/numa_balancing 2>/dev/null || echo 0)" != 0 ]; then
  echo "warning: NUMA balancing is on; AMD recommends: sudo sysctl kernel.numa_balancing=0" >&2
fi

export FORCE_TORCHRUN=1
export NPROC_PER_NODE="${NPROC_PER_NODE:-8}"
exec llamafactory-cli train "$config"
