#!/usr/bin/env bash
# Run encoder_jax on every worker of an existing TPU VM / pod slice.
#   launch/tpu_vm.sh TPU_NAME ZONE gs://bucket/workdir configs/bert_base.py [--config.x=y ...]
# Each worker finds the others through the TPU metadata (encoder_jax.run.distributed); see
# launch/README.md.
set -euo pipefail
TPU_NAME=$1; ZONE=$2; WORKDIR=$3; CONFIG=$4; shift 4
REPO_URL=${REPO_URL:?set REPO_URL to this repository\'s git URL}
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="
  set -e
  [ -d encoder_jax ] || git clone \"$REPO_URL\" encoder_jax
  cd encoder_jax && git pull --ff-only
  python3 -m pip install -q -e '.[tpu,tfds,gcs]'
  python3 -m encoder_jax.main --config=$CONFIG --workdir=$WORKDIR $*
"
