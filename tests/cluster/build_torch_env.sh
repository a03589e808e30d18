#!/usr/bin/env bash
# A virtual environment with PyTorch (CPU use; the PyPI wheel) for the tests that run the client
# against real tensors, cached outside the repository keyed by torch's version and this recipe, as
# the Kubernetes binaries are. torch is not a dependency of flowsched: a training image brings its
# own. A warm cache is a no-op; a cold one is one `pip install` (about 2 minutes and 5 GiB here).
#
#   tests/cluster/build_torch_env.sh   -> prints the environment's python on the last line
#   TORCH_VERSION=2.15.0 FLOWSCHED_CACHE=~/.cache/flowsched ...
set -euo pipefail

TORCH_VERSION="${TORCH_VERSION:-2.15.0}"
CACHE="${FLOWSCHED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flowsched}"
RECIPE=1  # changes whenever the environment is made differently, so a warm cache never serves an old one
dir="$CACHE/torch-$TORCH_VERSION-r$RECIPE"
py="$dir/venv/bin/python"

if [ -x "$py" ] && [ -f "$dir/done" ]; then
  echo "$py"
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir"
echo "building a torch $TORCH_VERSION environment in $dir ..." >&2
python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy >&2
"$py" -c "import torch; torch.stack([torch.ones(())]).tolist()" >&2
touch "$dir/done"
echo "$py"
