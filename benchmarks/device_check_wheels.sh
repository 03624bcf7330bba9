#!/bin/sh
# Downloads into .whl/ the wheels benchmarks/device_check.py needs on an accelerator machine
# beyond what its image has (docs/benchmarks.md, "The accelerator check"): ml-collections
# (configs) and tensorboardX (the training loop's event files), both pure Python; their own
# needs (absl-py, PyYAML, numpy, packaging, protobuf) are there. tensorflow and
# tensorflow-datasets are not needed (only 'tfds:' sources and gs:// paths import them).
# .whl/ is in .gitignore: copy it with the repository to the accelerator machine.
set -e
cd "$(dirname "$0")/.."
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 -d .whl \
    ml-collections==1.1.0 tensorboardX==2.6.5
ls -l .whl/*.whl
du -cb .whl/*.whl | tail -1
