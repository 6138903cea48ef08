#!/bin/sh
# Fails with a lot of stderr; only the tail belongs in the error.
i=0
while [ $i -lt 200 ]; do echo "noise line $i ......................................" >&2; i=$((i + 1)); done
echo "backend exploded: bucket missing" >&2
exit 3
