#!/usr/bin/env bash
# Fail when a banned libc function appears in the sources (see docs/conventions).
set -u
root=${1:-.}
hits=$(grep -rnE '\b(strcpy|strcat|sprintf|vsprintf|gets|atoi|atol|strtok)[[:space:]]*\(' \
  "$root/src" "$root/tests" --include='*.c' --include='*.h' 2>/dev/null)
if [ -n "$hits" ]; then
  echo "banned functions found:"; echo "$hits"; exit 1
fi
echo "no banned functions"
