#!/usr/bin/env bash
# Runs one fuzzer for a time: test/fuzz.sh PACKAGE FUZZER FUZZTIME.
#
# Go before 1.27 may end a run that found nothing with a bare "context
# deadline exceeded": its fuzzing coordinator races its own -fuzztime
# deadline (go.dev/issue/75804). Such a run passes here, said so; any other
# failure fails, a crasher above all, which go test writes to
# PACKAGE/testdata/fuzz/FUZZER/ to be kept as a seed once fixed.
set -uo pipefail
pkg=$1 fuzzer=$2 fuzztime=$3
go=${GO:-go}
corpus=$pkg/testdata/fuzz/$fuzzer
before=$(ls "$corpus" 2>/dev/null)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$go" test -vet=off -run '^$' -fuzz "^$fuzzer\$" -fuzztime "$fuzztime" "$pkg" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] && exit 0
case $("$go" env GOVERSION) in
go1.2[0-6] | go1.2[0-6].* | go1.2[0-6]rc*) ;;
*) exit "$rc" ;;
esac
if [ "$(ls "$corpus" 2>/dev/null)" = "$before" ] &&
	[ "$(grep -c -- '^--- FAIL' "$out")" = 1 ] &&
	grep -qx -- '    context deadline exceeded' "$out" &&
	! grep -q -e 'Failing input written' -e '^panic' -e 'fuzzing process hung' "$out"; then
	echo "$fuzzer: no failing input; the run ended on Go's own -fuzztime race (go.dev/issue/75804): passed"
	exit 0
fi
exit "$rc"
