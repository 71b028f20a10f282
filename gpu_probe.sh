#!/usr/bin/env bash
# Session-only helper for the device runs (not committed).
set -u
id; nproc; python3 --version
ip netns add sw-probe 2>&1 && echo NETNS_OK && ip netns del sw-probe
which tc ip || true
