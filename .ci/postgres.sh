#!/usr/bin/env bash
# PostgreSQL 15 for the team-server tests (tests/test_tracking_team.py). The tests start their own
# server from these binaries, in a temporary directory, on a free loopback port, as user postgres
# (tests/servers.py: Postgres); this script only makes sure initdb/pg_ctl are there and on PATH.
# Installs postgresql-15 (Debian) when missing. Prints the bin directory.
set -euo pipefail
if ! command -v initdb >/dev/null; then
  bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$bindir" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null
    bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  fi
  for tool in initdb pg_ctl postgres createdb pg_dump; do ln -sf "$bindir/$tool" /usr/local/bin/$tool; done
fi
id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
dirname "$(readlink -f "$(command -v initdb)")"
