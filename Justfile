# Recipes wrap the scripts the README and CI use, so there is one source of truth.
set shell := ["bash", "-cu"]

setup:
    ./scripts/setup.sh

serve *ARGS: setup
    .venv/bin/sr serve {{ARGS}}

test *ARGS:
    ./scripts/test.sh {{ARGS}}

bench *ARGS:
    .venv/bin/pip install -q -e ".[bench]"
    .venv/bin/python -m bench {{ARGS}}

lint:
    .venv/bin/ruff check sr tests bench examples deploy
    .venv/bin/ruff format --check sr tests bench examples deploy
