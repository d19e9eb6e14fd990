# Call BY: where the batched sparse loop's warps wait (call BW found no unit near its peak: issue 40%,
# L2 51%, 2.4 warps a scheduler at 5.6 cycles an instruction). ncu's per-reason stall counts
# (smsp__average_warps_issue_stalled_*_per_issue_active: warps stalled for each reason per issued
# instruction) of main's union and gather kernels at B32 L32768 T16 and the union at B8 L131072 T16
# (0.7 shared), sm_90 plan, the third call's launch. Carry .whl_kgen and .kcache. ~2 min.
set -u
source bench/pending/steps.sh
export KC=$PWD/.kcache
m=
for r in barrier long_scoreboard short_scoreboard wait mio_throttle math_pipe_throttle not_selected selected \
         dispatch_stall lg_throttle no_instruction membar sleeping branch_resolving drain imc_miss tex_throttle misc; do
    m+=smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio,
done
m+=smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active,gpu__time_duration.sum
for run in union:32,16,32768: gather:32,16,32768:--gather union8:8,16,131072:; do
    IFS=: read -r name shape flag <<< "$run"
    step "ncu_stall_$name" 90 ncu --clock-control none -k regex:sparse_[vg] --launch-skip 2 -c 1 --metrics "$m" \
        python3 -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape "$shape" --calls 3 $flag
done
cat "$OUT/summary.log"
