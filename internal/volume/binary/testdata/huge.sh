#!/bin/sh
# Prints more than 64 KiB on stdout.
printf '{"error":"'
head -c 70000 /dev/zero | tr '\0' x
printf '"}\n'
