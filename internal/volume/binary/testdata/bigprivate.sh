#!/bin/sh
# Create returns 2000 bytes of private_data (the limit is 1024).
PRIVATE=$(printf '%2000s' '' | tr ' ' x)
. "$(dirname "$0")/dirplugin.sh"
