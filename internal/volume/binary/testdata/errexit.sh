#!/bin/sh
# Exits 1 with the reason in the "error" field.
echo "stderr noise" >&2
echo '{"error":"volume is busy"}'
exit 1
