#!/bin/sh
# Attach leaves a daemon that inherited stdout and stderr (s3fs does this).
while [ $# -gt 0 ]; do
	[ "$1" = --volume-base-dir ] && base=$2
	shift 2
done
sleep 30 &
echo $! >"$base/daemon.pid"
mkdir -p "$base/d"
printf '{"host_path":"%s","metadata":{},"error":""}\n' "$base/d"
