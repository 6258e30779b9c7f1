#!/usr/bin/env bash
# The project's test command (README, .ci/run): install and start the real
# servers, then vet and run every test under the race detector. A test
# whose server is unreachable fails here; it does not skip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin

eval "$(bash scripts/services.sh up)"
export LOCKER_REQUIRE_SERVERS=1

go vet ./...
# The peer benchmarks (their own module, so that the peers are no dependency
# of locker's) are compiled and vetted; they run by hand (docs/benchmarks.md).
(cd internal/peers && go vet ./...)
# The OpenTelemetry adapter is a module of its own (so that locker's users
# do not depend on OpenTelemetry), and so is its example; their tests run
# beside the main module's.
(cd otellocker && go vet ./... && go test -race -count=1 -timeout 5m "$@" ./... &&
	cd ../examples/otel && go vet ./... && go test -race -count=1 -timeout 5m "$@" ./...) &
adapter=$!
status=0
# Every package in one run, cmd/lockctl's end-to-end processes beside the
# rest (go test's default -p, one package per core): the suite is correct
# under its own load (scripts/stress.sh checks it beside busy loops), and a
# phase of their own would add minutes to a run that must stay under 20.
go test -race -count=1 -timeout 15m "$@" ./... || status=$?
wait "$adapter" || status=$?
exit "$status"
