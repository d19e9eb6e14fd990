# Call BW: what a key costs in main's batched sparse loop, asked of ncu directly (bench/NOTES.md v102's
# reading): per-unit throughput (sm__throughput's breakdown: each pipe, the L1 / shared-memory data
# pipes, the TMA units) and the warp states of the union and gather kernels at B32 L32768 T16 (0.7
# shared), sm_90 plan, the third call's launch. Carry .whl_kgen and .kcache (bench.warm --group sparse
# of main). ~3 min.
set -u
source bench/pending/steps.sh
export KC=$PWD/.kcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >> "$OUT/summary.log"
metrics=breakdown:sm__throughput.avg.pct_of_peak_sustained_elapsed,breakdown:gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed.avg.per_cycle_active
metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum
for kernel in union gather; do
    flag= name=sparse_verify && [ $kernel = gather ] && flag=--gather name=sparse_gather
    step "ncu_$kernel" 120 ncu --clock-control none -k regex:$name --launch-skip 2 -c 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
        --metrics "$metrics" python3 -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape 32,16,32768 \
        --calls 3 $flag
done
cat "$OUT/summary.log"
