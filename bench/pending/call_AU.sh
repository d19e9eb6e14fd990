# Call AU (fortieth session, the last device minutes): the cluster-shared union scan (branch
# cluster-scan-wip) against main (.ab/main.tgz): bench.sparse --check (the float64 reference first)
# on B1 T16, no overlap and B8, one round each. Carry .whl_kgen and .ab.
set -u
source bench/pending/steps.sh
AB_MODULE=bench.sparse AB_TREES=main bash bench/gpu_ab.sh cluster 1 --check --shapes 0,5,1
