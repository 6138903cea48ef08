#!/bin/sh
# Logs to stdout before answering; the last line is the answer.
echo "mounting things..."
echo '{"token":"t","private_data":"p","error":""}'
