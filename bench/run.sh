#!/usr/bin/env bash
# Runs every benchmark: the XDP data plane (BPF_PROG_TEST_RUN), then the L7
# stage. Needs root for the data-plane benchmarks. Results: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -x bench/dataplane.sh ]]; then bash bench/dataplane.sh; fi
go test -run '^$' -bench 'BenchmarkL7Allow|BenchmarkL7Keyed|BenchmarkL7Middleware' -benchtime=1s -count=1 ./internal/l7/
go test -run '^$' -bench 'BenchmarkL7Redis' -benchtime=3s -count=1 ./internal/l7/redislimit
go test -run '^$' -bench 'BenchmarkShedAcquire' -benchtime=1s -count=1 ./internal/l7/shed
if [[ -x bench/l7.sh ]]; then bash bench/l7.sh; fi
if [[ -x bench/rls.sh ]]; then bash bench/rls.sh; fi
