#!/bin/sh
# Dies by SIGSEGV, as a crashing plugin binary would.
echo "about to crash" >&2
kill -SEGV $$
