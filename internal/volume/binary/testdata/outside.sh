#!/bin/sh
# Attach returns a host_path outside --volume-base-dir.
OUTSIDE=1
. "$(dirname "$0")/dirplugin.sh"
