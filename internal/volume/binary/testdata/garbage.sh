#!/bin/sh
# Exits 0 with stdout that is not a JSON answer.
echo 'hello, this is not json'
