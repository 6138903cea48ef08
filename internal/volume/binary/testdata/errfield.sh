#!/bin/sh
# Exits 0 but reports failure in the "error" field.
echo "some diagnostics" >&2
echo '{"token":"","private_data":"","error":"quota exceeded"}'
