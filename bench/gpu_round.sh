#!/usr/bin/env bash
# One H200 call for the open issues' GPU work (bench/NOTES.md, "Next session's GPU work"), from the
# repository root: `bash bench/gpu_round.sh [STEP ...]` (default: every step), carrying what the
# steps need: .whl (bench/gpu_wheels.sh: SGLang and pydantic) for sglang_dsa, .whl_peers
# (bench/peer_wheels.sh, plus pydantic's wheels) for peers and FlashMLA's column in sparse_bench,
# .kcache (python -m bench.warm .kcache) to compile nothing. $OUT gets round.log (a line per step,
# the tail of each failing step's log), logs.tgz (every step's log) and the benches' JSON; the device
# tool brings back 8 files at most. Steps (issue; about how long):
#   sglang           20, 22: kgen's SGLang backends (dense and DSA) against SGLang's and the reference (~3 min)
#   sglang_dsa       20, 22: the DSA backends' part of that (~90 s)
#   sparse_tests     21: the sparse GPU suite, both plans (~60 s)
#   wgmma_fp8_tests  20: the wgmma loop over fp8 rows against the reference (~40 s)
#   seesaw_check     19: the seesaw loop (v23): its GPU tests, then per-tensor fp8 rows on it and on the
#                    wgmma loop and the DSA pool's rows on it (bench.dsa_rows) (~3 min)
#   seesaw_speed     19: bench.model_validate's seesaw variants (4 and 3 stages, 8 and 16 heads) on 10
#                    shapes, issue 19's table of the plan at page 64 with the peers (.whl_peers), ncu of
#                    its verify kernel (~3 min)
#   dsa_rows         20: page-64 / DSA-row verify and decode timings, the plans', then per-tensor fp8 on the
#                    wgmma candidate (~60 s)
#   sparse_bench     21: union, gather and FlashMLA's sparse decode (~60 s)
#   ncu              20: the verify kernel of B=1 L=131072 T=16 under ncu: fp8 wgmma beside bf16 (~60 s)
#   peers            19: bench/gpu_peers.sh --short (~3 min)
#   e4m3_probe       the e4m3 defect: single-key logits and their per-row pattern, both plans (~40 s)
#   cta_trace        19: per-CTA timelines (start, work item found, attend done) of the verify kernel at B1 T16
#                    L = 64, 4096, 131072 and of the seesaw loop at L = 64 (bench/cta_trace.py; ~1 min)
#   pdl_dense        19: v29's dense PDL miss: the tree against a copy whose dense combine is launched
#                    programmatically (and whose prefix_attention triggers after its loop), B1 L4096-16384,
#                    B2 L4096, B4 L8192, twice each (~90 s)
#   host             19, 21: host us per call (bench.host) of the dense verify and the sparse verify (whose
#                    combine goes through cuLaunchKernelEx since v29) (~60 s)
#   sparse_trace     21: per-CTA timelines of the sparse verify (schedule, key list, Q, listed keys, tree,
#                    partial state) at B1 L131072 T16 (real and empty lists), T1, B8 (~1 min)
#   sparse_diag      21: B=1 L=131072 T=16 per-kernel times, anatomy, and ncu (full set, per-SASS stall
#                    samples as CSV) of the union kernel on real, all-shared and empty lists, and gather
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
logs=/tmp/round_logs
mkdir -p "$logs"
export KGEN_CACHE_DIR="${KGEN_CACHE_DIR:-$PWD/.kcache}" PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
step() {  # name, seconds, command...: run it under a time limit, say how it ended
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    timeout "$limit" "$@" > "$logs/$name.log" 2>&1
    rc=$?
    echo "$name: rc=$rc in $((SECONDS - start)) s; $(tail -1 "$logs/$name.log")" | tee -a "$out/round.log"
    [ "$rc" = 0 ] || { tail -40 "$logs/$name.log" | sed 's/^/    /' | cut -c1-400 >> "$out/round.log"; }
}
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$logs/install.log" 2>&1
[ -d .whl_peers ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl_peers/*.whl > "$logs/install_peers.log" 2>&1
# the verify kernel of one B=1 L=131072 T=16 call: speed of light, warp states, issue slots, occupancy
NCU=(ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats
     --section Occupancy -k regex:verify_attn -c 1 python3 -m bench.profile_one --shape 1,16,131072)
steps=("$@")
[ $# = 0 ] && steps=(seesaw_check seesaw_speed sglang sparse_tests wgmma_fp8_tests dsa_rows sparse_bench ncu peers)
for s in "${steps[@]}"; do case $s in
    sglang) step sglang 300 bash bench/gpu_sglang.sh ;;
    sglang_dsa) step sglang_dsa 150 bash bench/gpu_sglang.sh -k sglang_dsa_gpu ;;
    sparse_tests) step sparse_tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_gpu.py ;;
    wgmma_fp8_tests) step wgmma_fp8_tests 90 python3 -m pytest -q -p no:cacheprovider --tb=line \
        tests/test_attention_gpu.py -k "sm90_loops and wgmma" ;;
    dsa_rows) step dsa_rows 100 python3 -m bench.dsa_rows --out "$out"
              step dsa_rows_wgmma 100 python3 -m bench.dsa_rows --fp8-tiles wgmma:32,3,1 --out "$out" ;;
    seesaw_check) step seesaw_tests 240 python3 -m pytest -q -p no:cacheprovider -x tests/test_attention_gpu.py -k seesaw
        step seesaw_fp8_rows 100 python3 -m bench.dsa_rows --formats fp8 --fp8-tiles seesaw:32,3,1 --out "$out"
        step wgmma_fp8_rows 100 python3 -m bench.dsa_rows --formats fp8 --fp8-tiles wgmma:32,3,1 --out "$out"
        step seesaw_dsa_rows 100 python3 -m bench.dsa_rows --formats dsa --dsa-tiles seesaw:32,3,1 --out "$out" ;;
    seesaw_speed) step seesaw_timing 240 python3 -m bench.model_validate --out "$out/model_validate_seesaw.json" \
            --variants seesaw4,seesaw3,seesaw4_tp4 --shapes compute,compute_l32k,compute_b8,\
compute_t64,compute_b8_t64,small,small_b32,memory,h16_compute,h16_b16_t33
        step seesaw_peers 300 python3 -m bench.run --spec specs/glm5_p64_sm120.yaml --shapes issue19 --no-triton --peers all --no-halves \
            --out "$out"
        step ncu_bf16_seesaw 60 "${NCU[@]}" --spec specs/glm5_sm120.yaml --tiles seesaw:32,4,1 ;;
    sparse_bench) step sparse_bench 90 python3 -m bench.sparse --time-limit 60 --out "$out" ;;
    ncu) step ncu_fp8_rows_wgmma 60 "${NCU[@]}" --spec specs/glm5_dsa_fp8_sm120.yaml --tiles wgmma:32,3,1
         step ncu_fp8_tensor_wgmma 60 "${NCU[@]}" --spec specs/glm5_fp8_sm120.yaml --tiles wgmma:32,3,1
         step ncu_bf16_wgmma 60 "${NCU[@]}" --spec specs/glm5_sm120.yaml ;;
    peers) step peers 300 bash bench/gpu_peers.sh --short ;;  # gpu_peers.log, peers_results.tar.gz
    e4m3_probe) step e4m3_single 60 python3 -m bench.e4m3_tree_probe --single --q-scales 1,1000
                step e4m3_single_sm120 60 python3 -m bench.e4m3_tree_probe --single --q-scales 1,1000 --plan-arch sm_120 ;;
    cta_trace) for shape in 1,16,64 1,16,4096 1,16,131072; do
            step "cta_trace_$shape" 60 python3 -m bench.cta_trace --shape "$shape"; done
        step cta_trace_seesaw 60 python3 -m bench.cta_trace --shape 1,16,64 --tiles seesaw:32,4,1 ;;
    pdl_dense) rm -rf /tmp/pdl && mkdir -p /tmp/pdl && cp -r kgen templates bench specs /tmp/pdl/
        sed -i 's/c.tiles.bm, overlaps_attention=False/c.tiles.bm, overlaps_attention=True/' /tmp/pdl/kgen/kernels.py
        python3 -c "import sys; p = sys.argv[1]; s = open(p).read(); a = 'o, lse);\n    }\n}\n'; assert s.count(a) == 1
open(p, 'w').write(s.replace(a, 'o, lse);\n    }\n    launch_dependents();\n}\n'))" /tmp/pdl/templates/attention_kernels.cuh
        ab=(python3 -m bench.run --shapes 1x4096x16x8,1x8192x16x8,1x12288x16x8,1x16384x16x8,2x4096x16x8,4x8192x16x8
            --page-size 64 --no-triton --peers none --no-halves)
        for i in 1 2; do
            step "pdl_off_$i" 90 "${ab[@]}" --out "$logs/pdl_off_$i"
            (cd /tmp/pdl && step "pdl_on_$i" 90 env PYTHONPATH="/tmp/site:/tmp/pdl" KGEN_CACHE_DIR=/tmp/kc_pdl \
                "${ab[@]}" --out "$logs/pdl_on_$i")
        done ;;
    host) step host_dense 90 python3 -m bench.host --out "$out"
          step host_sparse 90 python3 -m bench.host --spec specs/glm5_dsa_sm120.yaml \
              --shapes 1,16,131072 1,1,131072 8,16,131072 --out "$out" ;;
    sparse_trace) for shape in 1,16,131072 1,1,131072 8,16,131072; do
            step "sparse_trace_$shape" 60 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape "$shape"; done
        step sparse_trace_empty 60 python3 -m bench.cta_trace --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072 \
            --empty-lists ;;
    sparse_diag) sp=(python3 -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072)
        step sparse_kernels 60 "${sp[@]}" --kernels
        step sparse_kernels_gather 60 "${sp[@]}" --kernels --gather
        step sparse_anatomy 120 python3 -m bench.sparse --anatomy --out "$out"
        for v in real:"" shared:"--shared 1.0" empty:"--empty-lists" gather:"--gather"; do
            name=${v%%:*}
            # shellcheck disable=SC2086
            step "ncu_sparse_$name" 90 ncu --clock-control none --set full -k regex:sparse_ -c 2 -f \
                -o "/tmp/ncu_sparse_$name" "${sp[@]}" ${v#*:}
            ncu -i "/tmp/ncu_sparse_$name.ncu-rep" --page details --csv > "$logs/ncu_sparse_${name}_details.csv" 2>&1
            ncu -i "/tmp/ncu_sparse_$name.ncu-rep" --page source --csv --print-source sass \
                > "$logs/ncu_sparse_${name}_sass.csv" 2>&1
        done ;;
    *) echo "unknown step $s" | tee -a "$out/round.log" ;;
esac; done
tar -czf "$out/logs.tgz" -C "$logs" .
