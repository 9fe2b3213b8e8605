#!/usr/bin/env bash
# Several nodes: run on every node with the same MASTER_ADDR/MASTER_PORT and that node's NODE_RANK:
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 examples/rocm/train_multi_node.sh TRAIN.yaml mi300x
# llamafactory-cli passes these to torchrun as --nnodes/--node_rank/--master_addr/--master_port.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# AMD's settings per GPU, shipped in the package (the files `llamafactory-zebra doctor` names).
envs="$here/../../llamafactory_zebra/environment/rocm"
config="${1:?usage: NNODES=.. NODE_RANK=.. MASTER_ADDR=.. MASTER_PORT=.. $0 TRAIN.yaml [mi300x|mi250]}"
gpu="${2:-mi300x}"
[ -f "$envs/$gpu.env" ] || { echo "unknown GPU '$gpu': use mi300x or mi250" >&2; exit 2; }
: "${NNODES:?set NNODES (number of nodes)}"
: "${NODE_RANK:?set NODE_RANK (0 on the master node, 1..NNODES-1 elsewhere)}"
: "${MASTER_ADDR:?set MASTER_ADDR (address of the NODE_RANK=0 node, reachable from all nodes)}"
# llamafactory-cli would pick a random free port on each node, and the nodes would never meet.
: "${MASTER_PORT:?set MASTER_PORT (the same free port on every node, e.g. 29500)}"

set -a
. "$envs/$gpu.env"
set +a
if [ -z "${NCCL_SOCKET_IFNAME:-}" ]; then
  echo "warning: NCCL_SOCKET_IFNAME is unset; RCCL may pick the wrong network interface (see docs/rocm.md)" >&2
fi

export FORCE_TORCHRUN=1 NNODES NODE_RANK MASTER_ADDR MASTER_PORT
export NPROC_PER_NODE="${NPROC_PER_NODE:-8}"
exec llamafactory-cli train "$config"
