#!/bin/sh
# Attach hangs (with a child) far beyond any timeout; pids go to the base dir.
while [ $# -gt 0 ]; do
	[ "$1" = --volume-base-dir ] && base=$2
	shift 2
done
echo $$ >"$base/sh.pid"
sleep 30 &
echo $! >"$base/sleep.pid"
wait
