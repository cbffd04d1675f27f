#!/usr/bin/env bash
# Nsight Compute profile of the backward kernels at one FA-paper shape (GPU machine, ncu on
# PATH): for each kernel, its time, tensor-pipe use, L2 hit rate, DRAM throughput, instructions
# and the main stall reasons (warps per issue), as CSV on stdout.
#   benches/ncu_bwd.sh FLASHATTN HEAD_DIM SEQLEN [CAUSAL=off] [DTYPE=bf16] [KERNEL_REGEX=flash_bwd]
# FLASHATTN is the `flashattn` binary (e.g. .gpu/bin/flashattn). ncu locks the clocks to base
# and flushes caches between kernels: compare kernels within one run, not with `bench` times.
set -euo pipefail
bin=$1 d=$2 s=$3 causal=${4:-off} dtype=${5:-bf16} kernels=${6:-flash_bwd}
metrics='gpu__time_duration.sum'
metrics+=',sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active'
metrics+=',lts__t_sector_hit_rate.pct'
metrics+=',dram__throughput.avg.pct_of_peak_sustained_elapsed'
metrics+=',smsp__inst_executed.sum'
metrics+=',smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio'
metrics+=',smsp__average_warps_issue_stalled_wait_per_issue_active.ratio'
metrics+=',smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio'
metrics+=',smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio'
metrics+=',smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio'
# The first launches are the bench's warm-up: one per kernel of the backward is enough.
ncu --metrics "$metrics" --kernel-name "regex:$kernels" --launch-count 4 --csv --page raw \
    "$bin" bench --backward --dtype "$dtype" --head-dims "$d" --seqlens "$s" --causal "$causal" --iters 1
